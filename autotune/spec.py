"""The study file: read once, validated strictly, frozen.

This is the only module that reads YAML. Every mistake raises `SpecError` naming the file, the
key, the value it got and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import SpecError
from autotune.space import DEFAULT_BASELINE, KNOBS, Choices, Domain, Range, Space, finite

PRESET_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# sqlite: one process (the default); journal: Optuna's journal file, for several local workers;
# postgresql/mysql: a database server, for workers on several machines.
STORAGE_SCHEMES = ("sqlite", "journal", "postgresql", "mysql")


@dataclasses.dataclass(frozen=True)
class Target:
    metric: str  # name of the task's validation metric, e.g. "accuracy"
    value: float  # the trial is feasible once the metric reaches this


@dataclasses.dataclass(frozen=True)
class Budget:
    trials: int  # finished trials in the storage, across every run of the study
    timeout: float | None  # seconds for this invocation of `autotune run`; None: no limit
    max_epochs: float  # per trial; also the length of the LR schedule
    max_seconds: float  # per trial, on the training clock
    eval_every: float  # epochs between evaluations: often enough that the clock stops near the crossing
    trial_timeout: float  # wall seconds after which a trial in a child process is killed as hung


@dataclasses.dataclass(frozen=True)
class Confirm:
    top: int  # best trials re-run on fresh seeds before the winner is named
    runs: int  # fresh seeds per confirmed configuration, and for the baseline


@dataclasses.dataclass(frozen=True)
class StudySpec:
    path: Path
    name: str
    task: str
    target: Target
    space: Space
    budget: Budget
    storage: str
    seed: int
    device: str
    baseline: tuple[tuple[str, Any], ...]
    confirm: Confirm
    isolation: str  # auto, process (a child process per trial) or none (trials in the study's process)


TOP_KEYS = ("name", "task", "target", "space", "budget", "storage", "seed", "device", "baseline", "confirm",
            "isolation")
ISOLATION_MODES = ("auto", "process", "none")
OPTIONAL_SECTIONS = ("space", "budget", "baseline", "confirm")
BUDGET_DEFAULTS = {"trials": 20, "timeout": None, "max_epochs": 10.0, "max_seconds": 60.0, "eval_every": 0.25,
                   "trial_timeout": None}
CONFIRM_DEFAULTS = {"top": 3, "runs": 3}


def load(path: str | Path, *, storage: str | None = None, isolation: str | None = None) -> StudySpec:
    """Read and validate a study file; `storage` (from the command line) overrides the file's."""
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, Mapping):
        raise SpecError(path, "(top level)", raw, "a study file is a mapping of keys such as task, target, space, budget")
    _reject_unknown(path, "", raw, TOP_KEYS)
    for key in ("task", "target"):
        if key not in raw:
            raise SpecError(path, key, None, f"{key} is required")

    name = raw.get("name", path.stem)
    _require(path, "name", name, isinstance(name, str) and name.strip() != "", "a non-empty string")
    task = raw["task"]
    _require(path, "task", task, isinstance(task, str) and task.strip() != "",
             "a built-in task name or package.module:callable")
    seed = raw.get("seed", 0)
    _require(path, "seed", seed, _is_int(seed) and seed >= 0, "a whole number of at least 0")
    device = raw.get("device", "auto")
    _require(path, "device", device, isinstance(device, str) and DEVICE_PATTERN.fullmatch(device) is not None,
             "auto, cpu, cuda or cuda:N")
    isolation = isolation if isolation is not None else raw.get("isolation", "auto")
    _require(path, "isolation", isolation, isolation in ISOLATION_MODES,
             "auto (a child process per trial on CUDA, none on CPU), process or none")
    storage = storage if storage is not None else raw.get("storage")
    if storage is None:
        storage = f"sqlite:///{path.resolve().parent / (path.stem + '.db')}"
    scheme = storage.split("://", 1)[0].split("+", 1)[0] if isinstance(storage, str) else None
    _require(path, "storage", storage, scheme in STORAGE_SCHEMES and "://" in storage,
             "a storage URL: sqlite:///study.db (one process), journal:///study.journal (several local workers) "
             "or postgresql://user@host/db (several machines)")

    return StudySpec(
        path=path,
        name=name,
        task=task,
        target=_target(path, raw["target"]),
        space=_space(path, raw.get("space", {})),
        budget=_budget(path, raw.get("budget", {})),
        storage=storage,
        seed=seed,
        device=device,
        baseline=_baseline(path, raw.get("baseline", {})),
        confirm=_confirm(path, raw.get("confirm", {})),
        isolation=isolation,
    )


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(path, "(file)", str(path), "no such file; give the path of a study .yaml file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, "(file)", str(path), f"cannot be read ({exc.__class__.__name__}); a readable text file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(path, "(yaml)", where, f"not valid YAML: {problem}") from None


def _require(path: Path, key: str, value: Any, ok: bool, accepted: str) -> None:
    if not ok:
        raise SpecError(path, key, value, f"expected {accepted}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(path: Path, key: str, value: Any, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    """A finite number above `minimum`; strings like "1e-3" (which YAML reads as text) are accepted."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
    ok = ok and (value >= minimum if inclusive else value > minimum)
    relation = "a number" if minimum == -math.inf else f"a number {'at least' if inclusive else 'greater than'} {minimum:g}"
    _require(path, key, value, ok, relation)
    return float(value)


def _mapping(path: Path, key: str, value: Any, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """A section of the file; an empty one (`budget:` with nothing under it) means all defaults."""
    if value is None and key in OPTIONAL_SECTIONS:
        return {}
    _require(path, key, value, isinstance(value, Mapping), f"a mapping with keys among {', '.join(allowed)}")
    _reject_unknown(path, key + ".", value, allowed)
    return value


def _reject_unknown(path: Path, prefix: str, raw: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(path, f"{prefix}{key}", key, f"unknown key; {hint}accepted keys: {', '.join(allowed)}")


def _target(path: Path, raw: Any) -> Target:
    raw = _mapping(path, "target", raw, ("metric", "value"))
    metric = raw.get("metric")
    _require(path, "target.metric", metric, isinstance(metric, str) and metric != "", "the name of the task's metric, e.g. accuracy")
    return Target(metric=metric, value=_number(path, "target.value", raw.get("value"), minimum=-math.inf))


def _budget(path: Path, raw: Any) -> Budget:
    raw = {**BUDGET_DEFAULTS, **_mapping(path, "budget", raw, tuple(BUDGET_DEFAULTS))}
    trials = raw["trials"]
    _require(path, "budget.trials", trials, _is_int(trials) and trials >= 1, "a whole number of at least 1")
    timeout = raw["timeout"]
    max_seconds = _number(path, "budget.max_seconds", raw["max_seconds"])
    trial_timeout = raw["trial_timeout"]
    return Budget(
        trials=trials,
        timeout=None if timeout is None else _number(path, "budget.timeout", timeout),
        max_epochs=_number(path, "budget.max_epochs", raw["max_epochs"]),
        max_seconds=max_seconds,
        eval_every=_number(path, "budget.eval_every", raw["eval_every"]),
        # Training stops at max_seconds; start-up and evaluations come on top, so leave room.
        trial_timeout=2 * max_seconds + 60 if trial_timeout is None else _number(path, "budget.trial_timeout", trial_timeout),
    )


def _confirm(path: Path, raw: Any) -> Confirm:
    raw = {**CONFIRM_DEFAULTS, **_mapping(path, "confirm", raw, tuple(CONFIRM_DEFAULTS))}
    for key in ("top", "runs"):
        _require(path, f"confirm.{key}", raw[key], _is_int(raw[key]) and raw[key] >= 0, "a whole number of at least 0")
    return Confirm(top=raw["top"], runs=raw["runs"])


def _knob_value(path: Path, key: str, name: str, value: Any) -> Any:
    knob = KNOBS[name]
    if knob.type is float and isinstance(value, str):
        value = _number(path, key, value)
    problem = knob.check(value)
    if problem:
        raise SpecError(path, key, value, problem)
    return value


def _domain(path: Path, key: str, name: str, raw: Any) -> Domain:
    """A knob's domain: {low, high, log} for a range, a list for choices, a scalar for fixed."""
    knob = KNOBS[name]
    if isinstance(raw, Mapping):
        if not knob.numeric:
            raise SpecError(path, key, dict(raw), f"{name} takes a list of choices or one value, not a range")
        _reject_unknown(path, key + ".", raw, ("low", "high", "log"))
        for bound in ("low", "high"):
            if bound not in raw:
                raise SpecError(path, f"{key}.{bound}", None, "a range needs both low and high")
        low = _knob_value(path, f"{key}.low", name, raw["low"])
        high = _knob_value(path, f"{key}.high", name, raw["high"])
        log = raw.get("log", False)
        _require(path, f"{key}.log", log, isinstance(log, bool), "true or false")
        if low >= high:
            raise SpecError(path, key, dict(raw), "a range needs low < high (give one value to fix the knob)")
        if log and low <= 0:
            raise SpecError(path, f"{key}.low", low, "a log-scale range needs low > 0")
        return Range(low=low, high=high, log=log)
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise SpecError(path, key, raw, f"an empty list; give at least one value for {name}")
    checked = tuple(_knob_value(path, f"{key}[{i}]" if isinstance(raw, list) else key, name, v)
                    for i, v in enumerate(values))
    if len(set(checked)) != len(checked):
        raise SpecError(path, key, raw, "choices must not repeat")
    return Choices(checked)


def _space(path: Path, raw: Any) -> Space:
    """The preset (by name from search_spaces/ or by path), then the study's per-knob overrides."""
    raw = _mapping(path, "space", raw, ("preset", *KNOBS))
    preset = raw.get("preset", "default")
    _require(path, "space.preset", preset, isinstance(preset, str) and preset != "", "a preset name or path")
    preset_path = _preset_path(path, preset)
    preset_raw = _read_yaml(preset_path)
    if not isinstance(preset_raw, Mapping):
        raise SpecError(preset_path, "(top level)", preset_raw, "a preset maps each knob to a range, a list or a value")
    _reject_unknown(preset_path, "", preset_raw, tuple(KNOBS))
    missing = [k for k in KNOBS if k not in preset_raw]
    if missing:
        raise SpecError(preset_path, missing[0], None, "a preset gives a domain for every knob")
    domains = []
    for name in KNOBS:
        if name in raw:
            domains.append((name, _domain(path, f"space.{name}", name, raw[name])))
        else:
            domains.append((name, _domain(preset_path, name, name, preset_raw[name])))
    return Space(tuple(domains))


def _preset_path(path: Path, preset: str) -> Path:
    if preset.endswith((".yaml", ".yml")) or "/" in preset:
        candidate = Path(preset)
        candidate = candidate if candidate.is_absolute() else path.resolve().parent / candidate
        if candidate.is_file():
            return candidate
    elif (PRESET_DIR / f"{preset}.yaml").is_file():
        return PRESET_DIR / f"{preset}.yaml"
    names = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    raise SpecError(path, "space.preset", preset, f"no such preset; built-in presets: {', '.join(names)}, or a path to a .yaml file")


def _baseline(path: Path, raw: Any) -> tuple[tuple[str, Any], ...]:
    raw = _mapping(path, "baseline", raw, tuple(KNOBS))
    config = dict(DEFAULT_BASELINE)
    for name, value in raw.items():
        config[name] = None if (name == "prefetch_factor" and value is None) else _knob_value(path, f"baseline.{name}", name, value)
    if config["num_workers"] == 0:
        config["prefetch_factor"] = None
    elif config["prefetch_factor"] is None:
        config["prefetch_factor"] = 2  # PyTorch's own default when workers are used
    return tuple(config.items())
