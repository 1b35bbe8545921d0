"""The joint systems probe (`probe: joint`): the loader and compute settings chosen together.

Deciding one knob at a time goes wrong where the loader and the arithmetic limit each other: a
loader settled at fp32 makes a narrower precision look useless, and a precision settled at that
loader makes more workers look useless. Here instead:

1. every compute setting's rate and every loader setting's rate are measured apart, at the
   probe's micro-batch (rates_apart.py): loader settings + compute settings runs. The
   compute settings are interleaved; the loaders run one at a time, fewest workers first, at the
   largest prefetch (side by side, one's workers would refill their queue on the cores another
   is timed on), and stop once one with workers outpaces every step;
2. each combination's speed is predicted as the slower of its two (model/roofline.py), and the
   best predicted is the knob space's limit; for a short run, where a setting's start-up
   (measured apart) outweighs a faster rate, the limit is the fastest with it counted, of the
   settings kept as `frontier`;
3. the few predicted soonest over the run the budget suggests (decide.run_length) are
   measured end to end with the real pipeline, one at a time (throughput.py), soonest
   first and none that one measured already outruns, and the one soonest over that run is kept:
   the loader knobs and the formats are fixed to it (until a trial reaching the target shows a
   run that another checked setting finishes sooner: chosen_setting.for_run), and a narrower
   precision stays only where it ran faster. On a CPU the loader and the step share the same
   cores, so their rates apart overstate what runs together: there the end-to-end measurement
   is what decides, and the report says so;
4. the chosen setting is measured again at the other micro-batches a trial may train
   (chosen_setting.at_batches), under goodput each narrower precision kept too. Under goodput
   and systems_only these figures are the table their trials are timed by
   (plan.from_probe). Under systems_only the probe chooses at the baseline's precision, the
   one its trials keep.

The outcome keeps the keys outcome.restrict reads (`loader`, `precisions`, `fixed`, ...), and
adds both rates, predicted beside measured, the bottleneck and the limit. Each measurement is
kept in the study as it ends (memo.py): a probe cut short goes on from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Any

from autotune import progress, signals
from autotune.probe import chosen_setting, paired_check, plan, rates_apart, throughput
from autotune.probe.cap import probe_cap
from autotune.probe.measuring import Measuring
from autotune.probe.memo import Memo
from autotune.probe.model import decide, roofline, text
from autotune.probe.model.figures import set_bytes, start_up_seconds
from autotune.probe.model.outcome import FASTER_BY, loader_settings
from autotune.record import seeds
from autotune.runners import isolation
from autotune.search.batches import largest_batch
from autotune.search.space import Space, complete
from autotune.spec.study_file import GOODPUT, StudySpec
from autotune.train import telemetry
from autotune.train.config import TrialConfig
from autotune.train.measure import cpu_count, other_load

# The probe's phases, by the measurement that runs each.
PHASES = {
    "measure_in_groups": "compute",
    "measure_loaders_in_turn": "loaders",
    "measure_in_turn": "end_to_end",
}


def run(spec: StudySpec, prepared: Measuring, memo: Memo | None = None) -> dict[str, Any]:
    """Measure, predict, check end to end and choose; the outcome as plain JSON values. `memo`:
    the measurements an earlier run of this probe kept, and where to keep new ones."""
    assert prepared.task is not None and prepared.measure is not None, "the probe trains its task"
    space = plan.probe_space(
        spec, prepared.space, prepared.baseline, batch_norm=prepared.batch_norm
    )
    prepared = dataclasses.replace(prepared, space=space)
    batch = largest_batch(space, prepared.baseline, samples=len(prepared.task.train))
    started, cap = time.monotonic(), probe_cap(spec)
    probing = _Probing(
        spec, prepared, batch, seeds.for_probe(spec.seed), {}, memo or Memo(), started + cap
    )
    where = {"device": prepared.device, "seed": probing.seed}
    with (
        progress.bar("joint probe", unit="measurement", leave=False) as bar,
        signals.interruptible(),
        other_load() as load,
    ):
        try:
            # the cap reaches into a measurement under way, where it measures
            prepared.measure(throughput.stop_rounds_at, time.time() + cap, **where)
            outcome = _choose(probing, bar)
        except isolation.TrialFailure as failure:
            # the task failed: the search meets it trial by trial
            outcome = _nothing_settled(batch, space, f"a measurement failed: {failure.reason}")
        except _TimeUp:
            why = f"its time cap of {cap:.0f} s was reached before it could choose"
            outcome = _nothing_settled(batch, space, why)
        # not after an interruption: the next probe sets its own, and nothing else reads it
        with contextlib.suppress(isolation.TrialFailure):
            prepared.measure(throughput.stop_rounds_at, None, **where)
    if probing.capped:
        outcome["capped"] = {"seconds": cap, **probing.capped}
    # the seconds of every run that measured for it: a probe cut short took its share there
    seconds = time.monotonic() - started + probing.memo.recalled_seconds
    return {**outcome, "seconds": seconds, **probing.memo.counted(), **load.record()}


class _TimeUp(Exception):
    """The probe's time cap passed before a measurement could start."""


@dataclasses.dataclass(frozen=True)
class _Probing:
    """What every step of one probe reads: the study, its measuring, and where the time went."""

    spec: StudySpec
    prepared: Measuring
    batch: int
    seed: int
    phases: dict[str, float]  # seconds by phase, for the report
    memo: Memo  # measurements kept as they end, and those an earlier run kept
    # time.monotonic() past which no measurement starts (cap.probe_cap)
    deadline: float = math.inf
    capped: dict[str, Any] = dataclasses.field(default_factory=dict)  # the phase the cap stopped

    def config(self, setting: dict[str, Any], batch: int | None = None) -> TrialConfig:
        """The baseline's maths at the probe's micro-batch (or `batch`), with `setting`'s systems
        knobs."""
        maths = {
            **self.prepared.baseline,
            "batch_size": batch or self.batch,
            "accumulation_steps": 1,
            "compile": False,
        }
        return TrialConfig.from_mapping(complete({**maths, **setting}))

    def measured(self, work: Any, *args: Any, phase: str | None = None) -> Any:
        """`work(*args)` where the study measures, its time counted to `phase` (where an
        earlier run measured it, the time it took there)."""
        phase = phase or PHASES[work.__name__]
        started, recalled = time.monotonic(), self.memo.recalled_seconds
        if started > self.deadline:
            self.capped.setdefault("phase", phase)
            raise _TimeUp
        try:
            device, seed = self.prepared.device, self.seed
            return self.memo.measured(self.prepared.measure, work, *args, device=device, seed=seed)
        finally:
            took = time.monotonic() - started + self.memo.recalled_seconds - recalled
            self.phases[phase] = self.phases.get(phase, 0.0) + took


@dataclasses.dataclass(frozen=True)
class _Checked:
    """The end-to-end check: the frontier, the runs it was weighed over, and what ran."""

    timed: list[tuple[roofline.Prediction, float]]  # the limit for every run length, fastest first
    runs: tuple[float, float]  # the shortest and longest run a trial trains, in samples
    run_samples: float  # the run the setting is chosen for
    speeds: list[tuple[roofline.Prediction, float | None, float]]  # measured, start-up apart
    reasons: list[str | None]  # why one has no speed


def _choose(probing: _Probing, bar: Any) -> dict[str, Any]:
    """Rates measured apart, combinations predicted, the best few checked end to end, compile
    weighed at the fastest: the probe's outcome."""
    spec, prepared, batch = probing.spec, probing.prepared, probing.batch
    space = prepared.space
    loaders = roofline.loader_settings(loader_settings(space))
    predictions, figures = rates_apart.predicted(
        probing.measured,
        loaders,
        roofline.compute_settings(space),
        probing.config,
        on_cpu=prepared.device.type == "cpu",
        bar=bar,
    )
    figures["phase_seconds"] = probing.phases  # filled in as the phases below run
    if not predictions:
        why = "no setting had both rates at that batch"
        return {**_nothing_settled(batch, space, why), **figures}
    checked = _check_end_to_end(probing, predictions, figures)
    bar.update(len(checked.speeds))
    if not any(speed for _, speed, _ in checked.speeds):
        return {**_nothing_settled(batch, space, "no setting ran end to end"), **figures}
    chosen, speed = decide.decide(checked.speeds, samples=checked.run_samples)
    chosen, speed, paired = _paired_with_baseline(probing, chosen, speed, predictions)
    if paired and paired["kept"] == paired_check.BASELINE:
        checked = _with_checked(checked, chosen, speed, figures, probing)
    fixed, memory, compiled = _formats_fixed(probing, chosen, figures, bar)
    precisions = (
        [chosen.compute["precision"]]  # the baseline's setting kept: its precision too
        if paired and paired["kept"] == paired_check.BASELINE
        else decide.precisions_kept(
            chosen, checked.speeds, space["precision"].values, faster_by=FASTER_BY
        )
    )
    entries = _at_batches(probing, chosen, speed, precisions)
    bar.update(len(entries))
    at_batches = [e for e in entries if "precision" not in e]
    other_precisions = [e for e in entries if "precision" in e]
    steps = {e["batch_size"]: e["compute_rate"] for e in at_batches if e.get("compute_rate")}
    steps = {batch: chosen.compute_rate, **steps}  # the step's rate by micro-batch
    return {
        "kind": "joint",
        "batch_size": batch,
        "shared_cores": prepared.device.type == "cpu",
        "loader": chosen.loader,
        "probed_loader": len(loaders) > 1,
        "precisions": precisions,
        "fixed": fixed,
        "speed": {},
        "runs": [],
        **figures,
        "checked": [
            {**p.figures(), "measured": m, "start_up": start, "reason": reason}
            for (p, m, start), reason in zip(checked.speeds, checked.reasons, strict=True)
        ],
        # the run the setting was chosen for, between the shortest and the longest a trial trains
        "run_samples": checked.run_samples,
        "run_range": list(checked.runs),
        "limit": checked.timed[0][0].figures(),
        "frontier": [p.figures() for p, _ in checked.timed],
        # checkpointing as measured (the baseline's): a trial with another recomputes otherwise
        "chosen": {
            **chosen.figures(),
            "measured": speed,
            "checkpointing": probing.config(chosen.setting).checkpointing,
        },
        # levers as the study file asked: one fitted away (no 2-D convolution) moves nothing
        "moves": text.what_moves_it(
            checked.timed[0][0], spec.space, batch=batch, cores=cpu_count(), step_rates=steps
        ),
        "batches": at_batches,
        **({"precision_batches": other_precisions} if other_precisions else {}),
        **({"compile": compiled} if compiled else {}),
        **({"checkpointing": memory} if memory else {}),
        **({"paired": paired} if paired else {}),
    }


def _paired_with_baseline(
    probing: _Probing,
    chosen: roofline.Prediction,
    speed: float,
    predictions: list[roofline.Prediction],
) -> tuple[roofline.Prediction, float, dict[str, Any] | None]:
    """The choice measured in windows paired with the baseline's own setting (paired_check.py);
    the baseline's setting, at its paired speed, where that check keeps it. Unchecked (None)
    where the choice is the baseline's setting, or the baseline's lies outside what was
    measured."""
    ours = complete(probing.prepared.baseline)
    baseline = next(
        (p for p in predictions if p.setting == {k: ours.get(k) for k in p.setting}), None
    )
    if baseline is None or baseline.setting == chosen.setting:
        return chosen, speed, None
    try:
        outcome = paired_check.against_baseline(
            lambda work, *args: probing.measured(work, *args, phase="paired"),
            probing.config(chosen.setting),
            probing.config(baseline.setting),
        )
        if outcome["kept"] == paired_check.CHOSEN:
            outcome = _paired_at_trials_batch(probing, chosen, baseline, outcome)
    except _TimeUp:  # unshown beside the baseline's: not taken
        outcome = paired_check.unchecked("not checked beside it before the probe's time cap")
    if outcome["kept"] == paired_check.BASELINE:
        paired_speed = outcome["speed"][paired_check.BASELINE]
        return baseline, paired_speed or baseline.samples_per_second, outcome
    return chosen, speed, outcome


def _paired_at_trials_batch(
    probing: _Probing,
    chosen: roofline.Prediction,
    baseline: roofline.Prediction,
    at_probe_batch: dict[str, Any],
) -> dict[str, Any]:
    """`at_probe_batch` (the choice kept beside the baseline's setting at the probe's batch) with
    the same pairing at the smallest micro-batch a trial trains, where the choice must not be
    slower (paired_check.no_slower): kept there, or the baseline's setting, saying why. As it is
    where no trial trains a smaller batch than the probe's."""
    spec, prepared = probing.spec, probing.prepared
    batches = plan.table_batches(
        spec, prepared.space, prepared.baseline, batch_norm=prepared.batch_norm
    )
    smallest = min([*batches, probing.batch])
    if smallest == probing.batch:
        return at_probe_batch

    try:
        there = paired_check.against_baseline(
            lambda work, *args: probing.measured(work, *args, phase="paired"),
            probing.config(chosen.setting, smallest),
            probing.config(baseline.setting, smallest),
            rule=paired_check.no_slower,
        )
    except _TimeUp:  # unshown at the trials' batch: not taken
        there = paired_check.unchecked("not checked there before the probe's time cap")
    except isolation.TrialFailure as failure:  # the task's, at that batch: the trials meet it
        there = paired_check.not_weighed(f"a measurement failed there: {failure.reason}")
    trials_batch = {"batch_size": smallest, **there}
    if there["kept"] == paired_check.CHOSEN:
        return {**at_probe_batch, "trials_batch": trials_batch}
    why = f"{there['why']}, at micro-batch {smallest}, the smallest a trial trains"
    return {
        **at_probe_batch,
        "kept": paired_check.BASELINE,
        "why": why,
        "trials_batch": trials_batch,
    }


def _with_checked(
    checked: _Checked,
    setting: roofline.Prediction,
    speed: float,
    figures: dict[str, Any],
    probing: _Probing,
) -> _Checked:
    """`checked` with `setting` among what ran end to end, at `speed` (as paired windows measured
    it, else as predicted) where it has no speed there: the baseline's setting kept by the paired
    check."""
    if any(p.setting == setting.setting for p, _, _ in checked.speeds):
        filled = [p.setting == setting.setting and not m for p, m, _ in checked.speeds]
        speeds = [
            (p, speed if fill else m, start)
            for (p, m, start), fill in zip(checked.speeds, filled, strict=True)
        ]
        # one outrun before its turn, then timed beside the baseline's: a figure, no reason
        reasons = [None if fill else r for r, fill in zip(checked.reasons, filled, strict=True)]
        return dataclasses.replace(checked, speeds=speeds, reasons=reasons)
    measured_on = {**figures, "shared_cores": probing.prepared.device.type == "cpu"}
    start = start_up_seconds({**measured_on, "cores": cpu_count()}, setting.setting)
    return dataclasses.replace(
        checked,
        speeds=[*checked.speeds, (setting, speed, start)],
        reasons=[*checked.reasons, None],
    )


def _formats_fixed(
    probing: _Probing, chosen: roofline.Prediction, figures: dict[str, Any], bar: Any
) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """The formats the trials train at: those measured, as chosen; checkpointing off where the
    space's largest micro-batch fits without it; compile off where it does not pay at the chosen
    setting. With the fit and compile's weighing, for the report (None where not made)."""
    fixed = {k: chosen.compute[k] for k in roofline.MEASURED_FORMATS}
    peaks = [rate.get("peak_memory_bytes") for rate in figures["compute_rates"]]
    space, kept = probing.prepared.space, set_bytes(figures, chosen.loader)
    device_bytes = telemetry.memory_bytes(probing.prepared.device)
    memory = roofline.checkpointing_fit(
        space, peaks, batch=probing.batch, device_bytes=device_bytes, set_bytes=kept
    )
    if memory is not None and memory["fits"]:
        fixed["checkpointing"] = False
    try:
        compiled = _weigh_compile(probing, chosen)
    except _TimeUp:  # not weighed: the trials train without it
        compiled = None
        if set(probing.prepared.space["compile"].values) == {False, True}:
            fixed["compile"] = False
    bar.update(2 if compiled else 0)
    if compiled and not compiled["kept"]:
        fixed["compile"] = False
    return fixed, memory, compiled


def _check_end_to_end(
    probing: _Probing, predictions: list[roofline.Prediction], figures: dict[str, Any]
) -> _Checked:
    """The settings predicted soonest over the run the budget suggests, and those fastest for
    some run it may train, measured end to end with the real pipeline."""
    spec, prepared = probing.spec, probing.prepared
    on_cpu = prepared.device.type == "cpu"
    measured_on = {**figures, "shared_cores": on_cpu, "cores": cpu_count()}
    starts = [(p, start_up_seconds(measured_on, p.setting)) for p in predictions]
    # the limit for every run length: the fastest, then settings that start sooner
    timed = roofline.frontier(starts)
    fastest, samples = timed[0][0].samples_per_second, len(prepared.task.train)
    runs = plan.run_range(spec, prepared.space, train_samples=samples, fastest=fastest)
    run_samples = decide.run_length(*runs)
    checked = decide.to_check(
        starts,
        samples=run_samples,
        count=decide.CHECKED * (2 if on_cpu else 1),
        within=runs,
    )
    # one at a time, as the loaders: side by side, each one's workers would refill their queue
    # while another is timed; soonest first, and none that one measured already outruns
    ends = probing.measured(
        throughput.measure_in_turn,
        {str(i): probing.config(p.setting) for i, (p, _) in enumerate(checked)},
        decide.Outrun(
            {str(i): (p.samples_per_second, start) for i, (p, start) in enumerate(checked)},
            within=runs,
        ),
        {str(i) for i, (p, _) in enumerate(checked) if rates_apart.queue_stays_full(p)},
    )
    # start-up as measured apart: the end-to-end windows begin after it
    results = [ends[str(i)] for i in range(len(checked))]
    return _Checked(
        timed,
        runs,
        run_samples,
        [(p, r.samples_per_second, start) for (p, start), r in zip(checked, results, strict=True)],
        [r.reason for r in results],
    )


def _weigh_compile(probing: _Probing, chosen: roofline.Prediction) -> dict[str, Any] | None:
    """Compile measured once at the chosen setting, where the space leaves it a choice."""
    if set(probing.prepared.space["compile"].values) != {False, True}:
        return None
    return chosen_setting.weigh_compile(
        lambda work, *args: probing.measured(work, *args, phase="compile"),
        probing.spec,
        probing.prepared,
        chosen,
        probing.config({**chosen.setting, "compile": False}),
    )


def _at_batches(
    probing: _Probing, chosen: roofline.Prediction, speed: float, precisions: list[str]
) -> list[dict[str, Any]]:
    """The chosen setting measured at every other micro-batch a trial may train; under goodput
    each other precision kept at every batch, a trial's table of its own."""
    spec, prepared = probing.spec, probing.prepared
    batches = plan.table_batches(
        spec, prepared.space, prepared.baseline, batch_norm=prepared.batch_norm
    )
    # a goodput trial trains its maths at any precision kept: each one's table of its own
    others = [p for p in precisions if p != chosen.compute["precision"]]
    every = sorted({probing.batch, *batches})
    wanted = {p: every for p in others} if spec.objective == GOODPUT else None
    try:
        return chosen_setting.at_batches(
            lambda work, *args: probing.measured(work, *args, phase="batches"),
            chosen,
            speed,
            [b for b in batches if b != probing.batch],
            probing.config,
            precisions=wanted,
        )
    except _TimeUp:  # the trials' other micro-batches unmeasured: none predicted there
        return []


def _nothing_settled(batch: int, space: Space, why: str) -> dict[str, Any]:
    """An outcome that leaves the space as it is, and says why."""
    return {
        "kind": "joint",
        "batch_size": batch,
        "loader": {},
        "probed_loader": False,
        "precisions": list(space["precision"].values),
        "fixed": {},
        "speed": {},
        "runs": [],
        "limit": None,
        "chosen": None,
        "unsettled": why,
        "loader_rates": [],
        "compute_rates": [],
    }
