"""The study file's `space` (preset, per-knob domains, the user's own parameters) and `baseline`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.search.knob import finite
from autotune.search.space import (
    DEFAULT_BASELINE,
    KNOBS,
    NO_LOADER,
    RESERVED,
    SCHEDULE,
    Choices,
    Domain,
    Range,
    Space,
    absent_domain,
    middle,
)
from autotune.spec.checks import is_int, mapping, number, read_yaml, reject_unknown, require

# package data: installed with autotune
PRESET_DIR = Path(__file__).resolve().parents[1] / "search" / "presets"


def _knob_value(path: Path, key: str, name: str, value: Any) -> Any:
    knob = KNOBS[name]
    if knob.type is float and isinstance(value, str):
        value = number(path, key, value)
    problem = knob.check(value)
    if problem:
        raise SpecError(path, key, value, problem)
    return knob.normal(value)


def _domain(path: Path, key: str, name: str, raw: Any) -> Domain:
    """A knob's domain: {low, high, log} for a range, a list for choices, a scalar for fixed."""
    knob = KNOBS[name]
    if isinstance(raw, Mapping):
        if not knob.numeric:
            raise SpecError(
                path, key, dict(raw), f"{name} takes a list of choices or one value, not a range"
            )
        reject_unknown(path, key + ".", raw, ("low", "high", "log"))
        for bound in ("low", "high"):
            if bound not in raw:
                raise SpecError(path, f"{key}.{bound}", None, "a range needs both low and high")
        low = _knob_value(path, f"{key}.low", name, raw["low"])
        high = _knob_value(path, f"{key}.high", name, raw["high"])
        log = raw.get("log", False)
        require(path, f"{key}.log", log, isinstance(log, bool), "true or false")
        if low >= high:
            raise SpecError(
                path, key, dict(raw), "a range needs low < high (give one value to fix the knob)"
            )
        if log and low <= 0:
            raise SpecError(path, f"{key}.low", low, "a log-scale range needs low > 0")
        return Range(low=low, high=high, log=log)
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise SpecError(path, key, raw, f"an empty list; give at least one value for {name}")
    checked = tuple(
        _knob_value(path, f"{key}[{i}]" if isinstance(raw, list) else key, name, v)
        for i, v in enumerate(values)
    )
    if len(set(checked)) != len(checked):
        raise SpecError(path, key, raw, "choices must not repeat")
    return Choices(checked)


def space(path: Path, raw: Any, *, max_epochs: float, fixed_schedule: bool = False) -> Space:
    """The preset (by name from search/presets/ or by path), then the study's per-knob overrides,
    then the user's own parameters (`space.params`).

    schedule_epochs may be left out of both: the schedule is then `max_epochs` long, or with
    `fixed_schedule` searched on a log scale from an eighth of it to all of it (airbench's
    objective makes the schedule's length the knob that trades time for accuracy).
    """
    raw = mapping(path, "space", raw, ("preset", "params", *KNOBS))
    preset_path, preset_raw = _preset(path, raw)
    domains = []
    for name in KNOBS:
        if name in raw:
            domains.append((name, _domain(path, f"space.{name}", name, raw[name])))
        elif name in preset_raw:
            domains.append((name, _domain(preset_path, name, name, preset_raw[name])))
        elif name != SCHEDULE:
            domains.append((name, absent_domain(name)))
        else:
            domains.append(
                (
                    name,
                    Range(max_epochs / 8, max_epochs, log=True)
                    if fixed_schedule
                    else Choices((max_epochs,)),
                )
            )
    schedule = dict(domains)[SCHEDULE]
    _check_schedule(path, raw, preset_path, preset_raw, schedule, max_epochs=max_epochs)
    return Space(tuple(domains), _params(path, raw.get("params")))


def _preset(path: Path, raw: Mapping[str, Any]) -> tuple[Path, Mapping[str, Any]]:
    """The preset the space starts from: its path, and its domain for every knob."""
    preset = raw.get("preset", "default")
    require(
        path,
        "space.preset",
        preset,
        isinstance(preset, str) and preset != "",
        "a preset name or path",
    )
    preset_path = _preset_path(path, preset)
    preset_raw = read_yaml(preset_path)
    if not isinstance(preset_raw, Mapping):
        raise SpecError(
            preset_path,
            "(top level)",
            preset_raw,
            "a preset maps each knob to a range, a list or a value",
        )
    reject_unknown(preset_path, "", preset_raw, tuple(KNOBS))
    # The schedule and the on/off systems knobs may be left out: presets written before they
    # existed.
    missing = [
        k for k in KNOBS if k not in preset_raw and k != SCHEDULE and absent_domain(k) is None
    ]
    if missing:
        raise SpecError(preset_path, missing[0], None, "a preset gives a domain for every knob")
    return preset_path, preset_raw


def _check_schedule(
    path: Path,
    raw: Mapping[str, Any],
    preset_path: Path,
    preset_raw: Mapping[str, Any],
    schedule: Domain,
    *,
    max_epochs: float,
) -> None:
    """No schedule longer than the budget's max_epochs, named where it was given."""
    longest = schedule.high if isinstance(schedule, Range) else max(schedule.values)
    if longest > max_epochs:
        where, key = (path, f"space.{SCHEDULE}") if SCHEDULE in raw else (preset_path, SCHEDULE)
        value = raw.get(SCHEDULE, preset_raw.get(SCHEDULE))
        raise SpecError(
            where,
            key,
            value,
            f"schedules of at most budget.max_epochs ({max_epochs:g}) epochs: "
            "raise max_epochs, or shorten the schedules",
        )


PARAM_VALUE = "a number, a string or true/false"


def _params(path: Path, raw: Any) -> tuple[tuple[str, Domain], ...]:
    """The user's own parameters: name -> {low, high, log} (whole numbers when both bounds are),
    a list of choices, or one value."""
    if raw is None:
        return ()
    require(
        path,
        "space.params",
        raw,
        isinstance(raw, Mapping),
        "a mapping of parameter names to a range {low, high, log}, a list of choices or one value",
    )
    params = []
    for name, domain in raw.items():
        key = f"space.params.{name}"
        if not (isinstance(name, str) and name.isidentifier()):
            raise SpecError(
                path,
                key,
                name,
                "a parameter name is a Python identifier (letters, digits, _), e.g. width",
            )
        if name in KNOBS or name in RESERVED:
            what = (
                "one of the knobs (set it under space: directly)"
                if name in KNOBS
                else "reserved for the command task"
            )
            raise SpecError(path, key, name, f"{name} is {what}; give the parameter another name")
        params.append((name, _param_domain(path, key, domain)))
    return tuple(params)


def _param_domain(path: Path, key: str, raw: Any) -> Domain:
    if isinstance(raw, Mapping):
        reject_unknown(path, key + ".", raw, ("low", "high", "log"))
        for bound in ("low", "high"):
            if bound not in raw:
                raise SpecError(path, f"{key}.{bound}", None, "a range needs both low and high")
        low, high = raw["low"], raw["high"]
        integers = is_int(low) and is_int(high)
        if not integers:  # keep whole-number bounds whole: they make an integer parameter
            low = number(path, f"{key}.low", low, minimum=-math.inf)
            high = number(path, f"{key}.high", high, minimum=-math.inf)
        log = raw.get("log", False)
        require(path, f"{key}.log", log, isinstance(log, bool), "true or false")
        if low >= high:
            raise SpecError(
                path,
                key,
                dict(raw),
                "a range needs low < high (give one value to fix the parameter)",
            )
        if log and low <= 0:
            raise SpecError(path, f"{key}.low", raw["low"], "a log-scale range needs low > 0")
        return Range(low=low, high=high, log=log)
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise SpecError(path, key, raw, "an empty list; give at least one value")
    for i, value in enumerate(values):
        ok = isinstance(value, (str, bool, int)) or (isinstance(value, float) and finite(value))
        require(path, f"{key}[{i}]" if isinstance(raw, list) else key, value, ok, PARAM_VALUE)
    if len(set(values)) != len(values):
        raise SpecError(path, key, raw, "choices must not repeat")
    return Choices(tuple(values))


def _preset_path(path: Path, preset: str) -> Path:
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        candidate = Path(preset)
        candidate = candidate if candidate.is_absolute() else path.resolve().parent / candidate
        if candidate.is_file():
            return candidate
    elif (PRESET_DIR / f"{preset}.yaml").is_file():
        return PRESET_DIR / f"{preset}.yaml"
    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    raise SpecError(
        path,
        "space.preset",
        preset,
        f"no such preset; built-in presets: {', '.join(names)}, or a path to a .yaml file",
    )


def baseline(
    path: Path, raw: Any, space: Space, *, max_epochs: float
) -> tuple[tuple[str, Any], ...]:
    """The configuration the winner is compared with: knobs from DEFAULT_BASELINE (a schedule of
    `max_epochs`), parameters from the middle of their domains, each overridden by the study
    file."""
    params = dict(space.params)
    raw = mapping(path, "baseline", raw, (*KNOBS, *params))
    config = {
        **DEFAULT_BASELINE,
        SCHEDULE: max_epochs,
        **{name: middle(name, domain) for name, domain in params.items()},
    }
    for name, value in raw.items():
        if name in params:
            ok = isinstance(value, (str, bool, int)) or (isinstance(value, float) and finite(value))
            require(path, f"baseline.{name}", value, ok, PARAM_VALUE)
            config[name] = value
        else:
            config[name] = (
                None
                if (name == "prefetch_factor" and value is None)
                else _knob_value(path, f"baseline.{name}", name, value)
            )
    if config[SCHEDULE] > max_epochs:
        raise SpecError(
            path,
            f"baseline.{SCHEDULE}",
            config[SCHEDULE],
            f"a schedule of at most budget.max_epochs ({max_epochs:g}) epochs",
        )
    if config["data_on_device"]:  # no DataLoader: its knobs do not exist (space.suggest)
        config.update(NO_LOADER)
    if config["num_workers"] == 0:
        config["prefetch_factor"] = None
    elif config["prefetch_factor"] is None:
        config["prefetch_factor"] = 2  # PyTorch's own default when workers are used
    return tuple(config.items())
