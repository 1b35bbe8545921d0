"""The goodput search in a study: the throughput table before the trials, the plan each trial
follows, and the systems-only mode (search/goodput.py holds the arithmetic).

The table holds each systems setting's speed, made once per study and stored with it, so a
resumed study and every worker use the same one: from the joint probe's figures where it ran
(`from_probe`), else measured by a throughput phase of its own. A goodput trial then trains
its maths with the fastest setting for it and is timed by the samples it needed. The
systems-only mode trains the baseline's maths once, and tells every other timed setting's time
from that run's samples: the settings leave the training unchanged, so the samples are the same.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from autotune import progress, signals
from autotune.record import schema, seeds
from autotune.runners import isolation
from autotune.search import goodput, roofline_figures
from autotune.search.space import FORMAT_KNOBS, LOADER_KNOBS, Choices, Space, complete, loader_of
from autotune.spec.study_file import GOODPUT, SYSTEMS_ONLY, StudySpec
from autotune.study import probe_memo, storage
from autotune.study.preparation import Prepared
from autotune.train import throughput
from autotune.train.config import TrialConfig
from autotune.train.measure import other_load
from autotune.train.throughput import Throughput

MAX_GROUP = 8  # configurations measured side by side at once: each holds its model and loader


def phase_settings(
    spec: StudySpec, space: Space, baseline: Mapping[str, Any], *, batch_norm: bool
) -> list[dict[str, Any]]:
    """The systems settings the phase measures: for the goodput search, every micro-batch x
    precision x format of the space at one accumulation step; for systems_only, every way to
    split the baseline's effective batch (its micro-batch alone with BatchNorm) x format, at the
    baseline's precision."""
    if spec.objective != SYSTEMS_ONLY:
        return [
            {**s, "accumulation_steps": 1} for s in goodput.settings_to_measure(space, baseline)
        ]
    effective = baseline["batch_size"] * baseline["accumulation_steps"]
    split = dict(
        goodput.splits(effective, space, micro_batch=baseline["batch_size"] if batch_norm else None)
    )
    if not split:  # the space cannot make the baseline's effective batch: the baseline's own split
        split = {baseline["batch_size"]: baseline["accumulation_steps"]}
    measured = goodput.settings_to_measure(
        space, baseline, precisions=[baseline["precision"]], batches=split
    )
    return [{**s, "accumulation_steps": split[s["batch_size"]]} for s in measured]


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
    return sorted(
        {s["batch_size"] for s in phase_settings(spec, space, baseline, batch_norm=batch_norm)}
    )


def from_probe(
    outcome: Mapping[str, Any],
    *,
    space: Space,
    precisions: Sequence[str],
    batches: Sequence[int],
    batch_norm: bool,
) -> dict[str, Any] | None:
    """The table from the joint probe's rates, measured apart and checked end to end at its
    batch (roofline_figures.table_entries), in place of a phase of its own. None, and a phase
    measures instead, where it does not time (or find out of memory) each of `batches` at each
    of `precisions` (a measurement failed; a probe stored before it measured them all), or where
    `space` leaves checkpointing a choice, or another value than the one the probe measured."""
    entries = roofline_figures.table_entries(outcome)
    known = {
        (e["settings"]["precision"], e["settings"]["batch_size"])
        for e in entries
        if e["speed"] or e["oom"]
    }
    if not entries or any((p, b) not in known for p in precisions for b in batches):
        return None
    if space["checkpointing"].values != (entries[0]["settings"]["checkpointing"],):
        return None
    return {"table": {"entries": entries, "batch_norm": batch_norm}, "from_probe": True}


def run_phase(
    spec: StudySpec,
    measure: isolation.Measure,
    device: Any,
    space: Space,
    baseline: Mapping[str, Any],
    *,
    batch_norm: bool,
) -> dict[str, Any]:
    """Measure the settings, side by side in groups of one precision and format (so that the
    micro-batches compared are measured interleaved); the stored outcome as plain JSON."""
    wanted = phase_settings(spec, space, baseline, batch_norm=batch_norm)
    entries: list[goodput.Entry] = []
    seconds = 0.0
    groups = [list(g) for _, g in itertools.groupby(wanted, key=goodput.format_key)]
    with (
        progress.bar("throughput phase", total=len(wanted), unit="setting", leave=False) as bar,
        signals.interruptible(),
        other_load() as load,
    ):
        for group in groups:
            for start in range(0, len(group), MAX_GROUP):
                chunk = group[start : start + MAX_GROUP]
                configs = {
                    str(i): TrialConfig.from_mapping(complete({**baseline, **s}))
                    for i, s in enumerate(chunk)
                }
                signals.check()
                measured = measure(
                    throughput.measure, configs, device=device, seed=seeds.for_throughput(spec.seed)
                )
                for i, s in enumerate(chunk):
                    figure = measured[str(i)]
                    speed = (
                        None
                        if figure.samples_per_second is None
                        else goodput.Speed(figure.samples_per_second, figure.fixed_seconds)
                    )
                    entries.append(goodput.Entry(s, speed, oom=figure.oom))
                    seconds += figure.startup_seconds + figure.windows * _window_seconds(figure, s)
                bar.update(len(chunk))
    table = goodput.Table(entries, batch_norm=batch_norm)
    return {"table": table.as_json(), "seconds": seconds, **load.record()}


def _window_seconds(figure: Throughput, settings: Mapping[str, Any]) -> float:
    """Seconds one timed window of `figure` took (its steps at its speed)."""
    if not figure.samples_per_second:
        return 0.0
    return (
        figure.window_steps
        * settings["batch_size"]
        * settings["accumulation_steps"]
        / figure.samples_per_second
    )


def due(spec: StudySpec, study: optuna.Study) -> bool:
    """Whether the study's objective needs a throughput table it has not stored yet."""
    return spec.objective in (GOODPUT, SYSTEMS_ONLY) and schema.throughput(study.user_attrs) is None


def ensure_phase(spec: StudySpec, prepared: Prepared, study: optuna.Study, space: Space) -> None:
    """The table once per study (a resumed one keeps its own), stored: from the joint probe's
    rates where it settled a setting, else measured by a throughput phase."""
    if not due(spec, study):
        return
    assert prepared.measure is not None, "preparation refuses goodput without a task"
    stored = schema.probe(study.user_attrs)  # the joint probe's, not one a study began with
    probed = stored if (stored or {}).get("kind") == "joint" else None
    # what its trials may train: the baseline's precision (systems_only), or any the space keeps
    precisions = (
        [prepared.baseline["precision"]]
        if spec.objective == SYSTEMS_ONLY
        else list(space["precision"].values)
    )
    batches = table_batches(spec, space, prepared.baseline, batch_norm=prepared.batch_norm)
    phase = (
        from_probe(
            probed,
            space=space,
            precisions=precisions,
            batches=batches,
            batch_norm=prepared.batch_norm,
        )
        if probed
        else None
    )
    if phase is None:
        # each measurement kept as it ends: a phase cut short goes on from there
        memo = probe_memo.Memo(study)
        measure = functools.partial(memo.measured, prepared.measure)
        phase = run_phase(
            spec, measure, prepared.device, space, prepared.baseline, batch_norm=prepared.batch_norm
        )
        phase.update(memo.counted())
    if schema.throughput(study.user_attrs) is not None:  # a run on another machine's
        progress.say(storage.FIRST_STORED.format(what="throughput table"))
        return
    schema.record_throughput(study, phase)
    # the report repeats it, so quiet hides it
    progress.tell(f"autotune: {goodput.describe(phase)}")


def plan_for(
    spec: StudySpec, prepared: Prepared, study: optuna.Study, space: Space
) -> tuple[Plan | None, Space]:
    """The plan the trials follow and the space they sample; no plan outside goodput."""
    phase = schema.throughput(study.user_attrs)
    if spec.objective not in (GOODPUT, SYSTEMS_ONLY) or phase is None:
        return None, space
    table = goodput.Table.from_json(phase["table"])
    # the split of an effective batch may use any of the space's micro-batches
    plan = Plan(table, space)
    sampled = (
        baseline_space(space, prepared.baseline)
        if spec.objective == SYSTEMS_ONLY
        else restrict(space, table)
    )
    return plan, sampled


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every goodput trial follows: the phase's table over the space the trials sample."""

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
    loader measured and the first format choice), so no sampled value goes unused."""
    if not table.entries:
        return space
    first = {**table.entries[0].settings, **loader_of(table.entries[0].settings)}
    for knob in (*LOADER_KNOBS, *FORMAT_KNOBS):
        space = space.replace(knob, Choices((first[knob],)))
    return space


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
