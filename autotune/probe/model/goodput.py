"""Goodput: a trial's time predicted from the samples its maths needs and the speed of the
fastest systems setting that trains the same maths (Pollux's goodput, split as autotune splits it).

A configuration's knobs fall in two groups. The maths (lr, schedule, effective batch, precision,
and the micro-batch itself where the model has BatchNorm) decides how many samples a run needs to
reach the target; the systems settings (how the effective batch splits into micro-batches, the
loader, memory format, compilation, cuDNN's search) decide how fast this machine trains them and
nothing else. The joint probe's figures (probe/run.py) time the systems settings into
a `Table`; a trial trains its
maths once per seed, and its time is

    fixed seconds + samples to target / samples per second

of the setting that makes that smallest. A step-time model, time per optimizer step = a + b x
micro-batch per precision and format, fills in micro-batches the table does not time, between
the smallest and the largest one it does. The largest micro-batch that fits, per precision, is
what the table learned: out of memory is one of its results.

Plain data and arithmetic: no torch here, so the rules are testable without training.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autotune.probe.model.outcome import load_note
from autotune.search.knob import DDP_NAMES
from autotune.search.space import (
    FORMAT_KNOBS,
    LOADER_KNOBS,
    Choices,
    Range,
    Space,
    loader_of,
)

# The systems knobs beside the micro-batch (which is one only without BatchNorm, whose statistics
# are per micro-batch).
# micro-batches measured from a range; the step-time model fills in between
MAX_MEASURED_BATCHES = 6


@dataclasses.dataclass(frozen=True)
class Speed:
    """How fast one systems setting trains: what a prediction is made of."""

    samples_per_second: float
    # start-up beyond its steps: loader start, compilation, first cuDNN searches
    fixed_seconds: float

    def seconds(self, samples: float) -> float:
        return self.fixed_seconds + samples / self.samples_per_second


@dataclasses.dataclass(frozen=True)
class Entry:
    """One measured systems setting: its knobs (micro-batch, precision, loader, format) and
    speed."""

    settings: Mapping[str, Any]
    speed: Speed | None  # None: it ran out of memory, or had no window to time
    oom: bool = False

    def as_json(self) -> dict[str, Any]:
        speed = None if self.speed is None else dataclasses.asdict(self.speed)
        return {"settings": dict(self.settings), "speed": speed, "oom": self.oom}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        speed = data.get("speed")
        return cls(
            data["settings"], None if speed is None else Speed(**speed), oom=bool(data.get("oom"))
        )


def values_of(domain: Any, *, most: int | None = None) -> list[Any]:
    """A domain's values: its choices, or, for a whole-number range, the powers of two in it and
    its ends (at most `most` of them, spread evenly)."""
    if isinstance(domain, Choices):
        return list(domain.values)
    assert isinstance(domain, Range)
    low, high = int(domain.low), int(domain.high)
    values = sorted(
        {
            low,
            high,
            *(
                2**k
                for k in range(int(math.log2(max(low, 1))), int(math.log2(high)) + 1)
                if low <= 2**k <= high
            ),
        }
    )
    if most is not None and len(values) > most:
        picks = {round(i * (len(values) - 1) / (most - 1)) for i in range(most)}
        values = [v for i, v in enumerate(values) if i in picks]
    return values


def contains(domain: Any, value: Any) -> bool:
    if isinstance(domain, Choices):
        return value in domain.values
    return domain.low <= value <= domain.high


def measured_batches(space: Space) -> list[int]:
    """The micro-batches a goodput table times: the space's (values_of), the step-time model
    filling in between."""
    return values_of(space["batch_size"], most=MAX_MEASURED_BATCHES)


def splits(
    effective: int, space: Space, *, micro_batch: int | None = None
) -> list[tuple[int, int]]:
    """The (micro-batch, accumulation steps) pairs of the space that make `effective`; only
    `micro_batch` itself when it is fixed (BatchNorm)."""
    accumulation = space["accumulation_steps"]
    candidates = [micro_batch] if micro_batch is not None else range(1, effective + 1)
    return [
        (m, effective // m)
        for m in candidates
        if effective % m == 0
        and contains(space["batch_size"], m)
        and contains(accumulation, effective // m)
    ]


def fit_step_time(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """Least-squares a, b of seconds per optimizer step = a + b x micro-batch (one accumulation
    step), from (micro-batch, samples per second) points; None with fewer than two micro-batches."""
    if len({m for m, _ in points}) < 2:
        return None
    xs = [m for m, _ in points]
    ys = [m / speed for m, speed in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return mean_y - b * mean_x, b


class Table:
    """Systems settings' measured speeds, and the fastest way to train a configuration's maths."""

    def __init__(self, entries: Iterable[Entry], *, batch_norm: bool) -> None:
        self.entries = list(entries)
        self.batch_norm = batch_norm

    def as_json(self) -> dict[str, Any]:
        return {"entries": [e.as_json() for e in self.entries], "batch_norm": self.batch_norm}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        return cls(
            (Entry.from_json(e) for e in data["entries"]), batch_norm=bool(data["batch_norm"])
        )

    def largest_fitting(self) -> dict[str, int]:
        """Per precision, the largest micro-batch measured without running out of memory."""
        largest: dict[str, int] = {}
        for entry in self.entries:
            if entry.speed is not None:
                precision, batch = entry.settings["precision"], entry.settings["batch_size"]
                largest[precision] = max(largest.get(precision, 0), batch)
        return largest

    def speed_of(self, settings: Mapping[str, Any]) -> Speed | None:
        """The speed of `settings` (micro-batch, precision, format; the loader as measured):
        measured, or, between measured micro-batches of its precision and format, from the
        step-time model; None where neither knows (or it ran out of memory)."""
        key = format_key(settings)
        same = [e for e in self.entries if format_key(e.settings) == key]
        batch = settings["batch_size"]
        for entry in same:
            if entry.settings["batch_size"] == batch:
                return entry.speed
        measured = [e for e in same if e.speed is not None]
        if any(e.oom and e.settings["batch_size"] <= batch for e in same) or not measured:
            return None
        batches = [e.settings["batch_size"] for e in measured]
        model = fit_step_time(
            [(e.settings["batch_size"], e.speed.samples_per_second) for e in measured]
        )
        if (
            model is None
            or not min(batches) <= batch <= max(batches)
            or model[0] + model[1] * batch <= 0
        ):
            return None
        nearest = min(measured, key=lambda e: abs(e.settings["batch_size"] - batch))
        return Speed(batch / (model[0] + model[1] * batch), nearest.speed.fixed_seconds)

    def options(
        self, config: Mapping[str, Any], space: Space
    ) -> list[tuple[dict[str, Any], Speed]]:
        """Every measured way to train `config`'s maths: the systems knobs it would take, each
        with its speed."""
        effective = config["batch_size"] * config["accumulation_steps"]
        fixed_batch = config["batch_size"] if self.batch_norm else None
        loader = loader_of(self.entries[0].settings) if self.entries else {}
        formats = {
            format_key(e.settings)[1:]
            for e in self.entries
            if e.settings["precision"] == config["precision"]
        }
        found = []
        for (micro, steps), form in itertools.product(
            splits(effective, space, micro_batch=fixed_batch), sorted(formats)
        ):
            settings = {
                "batch_size": micro,
                "precision": config["precision"],
                **dict(zip(FORMAT_KNOBS, form)),
            }
            speed = self.speed_of(settings)
            if speed is not None:
                found.append(({**settings, "accumulation_steps": steps, **loader}, speed))
        return found

    def fastest(
        self, config: Mapping[str, Any], space: Space, *, samples: float | None
    ) -> tuple[dict[str, Any], Speed] | None:
        """`config` trained by its fastest systems setting: the least predicted time for
        `samples` samples (None: the highest speed), as (the configuration, its speed); None
        when no measured setting trains its maths (each ran out of memory)."""
        options = self.options(config, space)
        if not options:
            return None
        if samples is None:
            knobs, speed = max(options, key=lambda o: o[1].samples_per_second)
        else:
            knobs, speed = min(options, key=lambda o: o[1].seconds(samples))
        return {**config, **knobs}, speed


def describe(phase: Mapping[str, Any]) -> str:
    """One line for the report: what the table times (and, measured apart by an earlier engine,
    what it cost)."""
    table = Table.from_json(phase["table"])
    measured = [e for e in table.entries if e.speed is not None]
    fastest = max(measured, key=lambda e: e.speed.samples_per_second, default=None)
    parts = [f"{len(measured)} of {len(table.entries)} systems settings measured"]
    if fastest is not None:
        parts.append(
            f"fastest {fastest.speed.samples_per_second:,.0f} samples/s "
            f"at batch {fastest.settings['batch_size']}, {fastest.settings['precision']}"
        )
    ran_out = [e for e in table.entries if e.oom]
    if ran_out:
        parts.append(
            "largest micro-batch that fits: "
            + ", ".join(f"{p} {b}" for p, b in sorted(table.largest_fitting().items()))
        )
    if phase.get("kept_measurements"):
        parts.append(f"{phase['kept_measurements']} of its measurements kept from a run cut short")
    # from the joint probe: its own line says what it measured, and beside what load
    if phase.get("from_probe"):
        return "Trials timed from the probe's table: " + "; ".join(parts)
    return (
        f"Throughput table measured apart ({phase['seconds']:.1f} s): "
        + "; ".join(parts)
        + load_note(phase)
    )


def format_key(settings: Mapping[str, Any]) -> tuple[Any, ...]:
    # a knob a stored table predates was off; checkpointing's share stays as it is
    return (settings["precision"], *(settings.get(k) or False for k in FORMAT_KNOBS))


def same_maths(a: Mapping[str, Any], b: Mapping[str, Any], *, batch_norm: bool) -> bool:
    """True when `a` and `b` train the same maths: they differ at most in systems settings."""
    systems = {*LOADER_KNOBS, *FORMAT_KNOBS, *DDP_NAMES, "accumulation_steps", "batch_size"}
    if a["batch_size"] * a["accumulation_steps"] != b["batch_size"] * b["accumulation_steps"]:
        return False
    if batch_norm and a["batch_size"] != b["batch_size"]:
        return False
    return all(a[k] == b.get(k) for k in a if k not in systems)
