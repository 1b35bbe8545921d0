"""What the probe's figures plan for a study's trials, without Optuna: the micro-batches a trial
may train (the probe measures its chosen setting at each), the space the probe chooses in, the
goodput table from the probe's outcome, the plan a goodput trial follows by it, the space a
goodput or systems_only study samples, and how long a trial's run may be.

The table holds each systems setting's speed, from the joint probe's figures (`from_probe`),
stored with the study once (study/goodput_table.py), so a resumed study and every worker use the
same one. A goodput trial then trains its maths with the fastest setting for it and is timed by
the samples it needed (model/goodput.py holds the arithmetic). The systems-only mode trains the
baseline's maths once, and tells every other timed setting's time from that run's samples: the
settings leave the training unchanged, so the samples are the same. Without a table (the probe
settled nothing) the trials run on their own clocks, the systems-only mode on the baseline's
setting alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from autotune.probe.model import figures, goodput
from autotune.search.space import FORMAT_KNOBS, LOADER_KNOBS, SCHEDULE, Choices, Space, loader_of
from autotune.spec.study_file import FIXED_SCHEDULE, SYSTEMS_ONLY, StudySpec


def systems_only_splits(space: Space, baseline: Mapping[str, Any], *, batch_norm: bool) -> dict:
    """systems_only: micro-batch -> accumulation steps, every way the space splits the baseline's
    effective batch (its micro-batch alone with BatchNorm), else the baseline's own split."""
    effective = baseline["batch_size"] * baseline["accumulation_steps"]
    split = dict(
        goodput.splits(effective, space, micro_batch=baseline["batch_size"] if batch_norm else None)
    )
    return split or {baseline["batch_size"]: baseline["accumulation_steps"]}


def probe_space(
    spec: StudySpec, space: Space, baseline: Mapping[str, Any], *, batch_norm: bool
) -> Space:
    """The space the joint probe chooses in: under systems_only, the baseline's precision and the
    micro-batches that split its effective batch, as its trials train nothing else (a setting
    chosen at another would serve none of them); `space` otherwise."""
    if spec.objective != SYSTEMS_ONLY:
        return space
    micro = table_batches(spec, space, baseline, batch_norm=batch_norm)
    return space.replace("precision", Choices((baseline["precision"],))).replace(
        "batch_size", Choices(tuple(micro))
    )


def table_batches(
    spec: StudySpec, space: Space, baseline: Mapping[str, Any], *, batch_norm: bool
) -> list[int]:
    """The micro-batches a trial of this study may train: the joint probe measures its chosen
    setting at each (under goodput and systems_only, the table their trials are timed by)."""
    if spec.objective != SYSTEMS_ONLY:
        return goodput.measured_batches(space)
    return sorted(systems_only_splits(space, baseline, batch_norm=batch_norm))


def from_probe(outcome: Mapping[str, Any], *, batch_norm: bool) -> dict[str, Any] | None:
    """The table from the joint probe's rates, measured apart and checked end to end at its
    batch and measured again at every micro-batch a trial may train (figures.table_entries).
    None where the probe chose nothing (or is an earlier engine's, which measured no table)."""
    entries = figures.table_entries(outcome) if outcome.get("kind") == "joint" else []
    if not entries:
        return None
    return {"table": {"entries": entries, "batch_norm": batch_norm}, "from_probe": True}


@dataclasses.dataclass(frozen=True)
class GoodputSettings:
    """What every goodput trial follows: the table over the space the trials sample."""

    table: goodput.Table
    space: Space

    def to_train(self, config: Mapping[str, Any]) -> dict[str, Any] | None:
        """`config` as a trial trains it: its maths by the fastest setting; None where none fits."""
        fastest = self.table.fastest(config, self.space, samples=None)
        return None if fastest is None else fastest[0]

    def best(
        self, config: Mapping[str, Any], samples: float
    ) -> tuple[dict[str, Any], goodput.Speed]:
        """The setting that trains `samples` samples of `config`'s maths soonest, and its speed."""
        fastest = self.table.fastest(config, self.space, samples=samples)
        assert fastest is not None, "a trial that trained has a setting"
        return fastest

    def predict(self, config: Mapping[str, Any]) -> Callable[[float], float]:
        """Samples to target -> predicted seconds, by the best setting for that many samples."""
        return lambda samples: self.best(config, samples)[1].seconds(samples)


def restrict(space: Space, table: goodput.Table) -> Space:
    """The space a goodput study samples: the systems knobs its plan chooses are fixed (to the
    loader measured and the first format choice), so no sampled value goes unused, and the
    precisions to those the table times, so no trial's maths is left without a setting."""
    if not table.entries:
        return space
    first = {**table.entries[0].settings, **loader_of(table.entries[0].settings)}
    for knob in (*LOADER_KNOBS, *FORMAT_KNOBS):
        space = space.replace(knob, Choices((first[knob],)))
    timed = {e.settings["precision"] for e in table.entries if e.speed is not None}
    kept = tuple(p for p in space["precision"].values if p in timed)
    return space.replace("precision", Choices(kept)) if kept else space


def chosen_systems(space: Space) -> dict[str, Any]:
    """The systems knobs `restrict` fixed, with their values."""
    fixed = space.fixed()
    return {k: fixed[k] for k in (*LOADER_KNOBS, *FORMAT_KNOBS) if k in fixed}


def baseline_space(space: Space, baseline: Mapping[str, Any]) -> Space:
    """systems_only: every knob fixed to the baseline's, so its one trained trial is the
    baseline's maths."""
    for name, _ in space.domains:
        space = space.replace(name, Choices((baseline[name],)))
    return dataclasses.replace(
        space, params=tuple((name, Choices((baseline[name],))) for name, _ in space.params)
    )


def run_range(
    spec: StudySpec, space: Space, *, train_samples: int, fastest: float
) -> tuple[float, float]:
    """The shortest and the longest run, in samples, a trial of the study trains: at least to its
    first evaluation (a run stops there at the earliest), or under fixed_schedule its shortest
    schedule (each run trains its whole schedule); at most `max_epochs`, or `max_seconds` at the
    `fastest` rate (samples a second), whichever is fewer, and the shortest no longer than that
    (a budget that ends before the first evaluation evaluates there)."""
    longest = min(spec.budget.max_epochs * train_samples, spec.budget.max_seconds * fastest)
    if spec.objective == FIXED_SCHEDULE:
        schedules = space[SCHEDULE]
        least = min(schedules.values) if isinstance(schedules, Choices) else schedules.low
        shortest = least * train_samples
    else:
        shortest = spec.budget.eval_every * train_samples
    return min(shortest, longest), longest
