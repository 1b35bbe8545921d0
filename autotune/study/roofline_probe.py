"""The joint systems probe (`probe: joint`): the loader and compute settings chosen together.

Deciding one knob at a time goes wrong where the loader and the arithmetic limit each other: a
loader settled at fp32 makes a narrower precision look useless, and a precision settled at that
loader makes more workers look useless. Here instead:

1. every compute setting's rate and every loader setting's rate are measured apart, at the
   probe's micro-batch (study/rates_apart.py): loader settings + compute settings runs. The
   compute settings are interleaved; the loaders run one at a time, fewest workers first, at the
   largest prefetch (side by side, one's workers would refill their queue on the cores another
   is timed on), and stop once one with workers outpaces every step;
2. each combination's speed is predicted as the slower of its two (search/roofline.py), and the
   best predicted is the knob space's limit; for a short run, where a setting's start-up
   (measured apart) outweighs a faster rate, the limit is the fastest with it counted, of the
   settings kept as `frontier`;
3. the few predicted soonest over the run the budget suggests (end_to_end.run_length) are
   measured end to end with the real pipeline, one at a time (train/throughput.py), soonest
   first and none that one measured already outruns, and the one soonest over that run is kept:
   the loader knobs and the formats are fixed to it (until a trial reaching the target shows a
   run that another checked setting finishes sooner: chosen_setting.for_run), and a narrower
   precision stays only where it ran faster. On a CPU the loader and the step share the same
   cores, so their rates apart overstate what runs together: there the end-to-end measurement
   is what decides, and the report says so;
4. the chosen setting is measured again at the other micro-batches a trial may train
   (chosen_setting.at_batches), under goodput each narrower precision kept too. Under goodput
   and systems_only these figures are the table their trials are timed by
   (throughput_phase.from_probe): no throughput phase of its own. Under systems_only the probe
   chooses at the baseline's precision, the one its trials keep.

The outcome keeps the greedy probe's keys (`loader`, `precisions`, ...) for probe.restrict, and
adds both rates, predicted beside measured, the bottleneck and the limit.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from autotune import progress, signals
from autotune.record import seeds
from autotune.runners import isolation
from autotune.search import end_to_end, probe, roofline, roofline_text
from autotune.search.roofline_figures import start_up_seconds
from autotune.search.space import Space, complete
from autotune.spec.study_file import GOODPUT, StudySpec
from autotune.study import budget, chosen_setting, rates_apart, throughput_phase
from autotune.study.preparation import Prepared
from autotune.train import telemetry, throughput
from autotune.train.config import TrialConfig
from autotune.train.measure import cpu_count, other_load

# The probe's phases, by the measurement that runs each.
PHASES = {
    "measure_in_groups": "compute",
    "measure_loaders_in_turn": "loaders",
    "measure_in_turn": "end_to_end",
}


def run(spec: StudySpec, prepared: Prepared) -> dict[str, Any]:
    """Measure, predict, check end to end and choose; the outcome as plain JSON values."""
    assert prepared.task is not None and prepared.measure is not None, (
        "the probe trains the study's task"
    )
    space = throughput_phase.probe_space(
        spec, prepared.space, prepared.baseline, batch_norm=prepared.batch_norm
    )
    prepared = dataclasses.replace(prepared, space=space)
    batch = probe.probe_batch(space, prepared.baseline, samples=len(prepared.task.train))
    started = time.monotonic()
    with (
        progress.bar("joint probe", unit="measurement", leave=False) as bar,
        signals.interruptible(),
        other_load() as load,
    ):
        try:
            outcome = _choose(spec, prepared, batch, bar)
        except isolation.TrialFailure as failure:
            # the task failed: the search meets it trial by trial
            outcome = _nothing_settled(batch, space, f"a measurement failed: {failure.reason}")
    return {**outcome, "seconds": time.monotonic() - started, **load.record()}


def _choose(spec: StudySpec, prepared: Prepared, batch: int, bar: Any) -> dict[str, Any]:
    """Rates measured apart, combinations predicted, the best few checked end to end, compile
    weighed at the fastest: the probe's outcome."""
    space, device, measure = prepared.space, prepared.device, prepared.measure
    maths = {**prepared.baseline, "batch_size": batch, "accumulation_steps": 1, "compile": False}
    loaders = roofline.loader_settings(probe.loader_settings(space))
    seed = seeds.for_probe(spec.seed)

    def config(setting: dict[str, Any]) -> TrialConfig:
        return TrialConfig.from_mapping(complete({**maths, **setting}))

    phases: dict[str, float] = {}  # where the probe's time went, for the report

    def measured(work: Any, *args: Any, phase: str | None = None) -> dict[str, Any]:
        started = time.monotonic()
        try:
            return measure(work, *args, device=device, seed=seed)
        finally:
            phase = phase or PHASES[work.__name__]
            phases[phase] = phases.get(phase, 0.0) + time.monotonic() - started

    predictions, figures = rates_apart.predicted(
        measured,
        loaders,
        roofline.compute_settings(space),
        config,
        on_cpu=device.type == "cpu",
        bar=bar,
    )
    figures["phase_seconds"] = phases  # filled in as the phases below run
    if not predictions:
        why = "no setting had both rates at that batch"
        return {**_nothing_settled(batch, space, why), **figures}
    measured_on = {**figures, "shared_cores": device.type == "cpu", "cores": cpu_count()}
    starts = [(p, start_up_seconds(measured_on, p.setting)) for p in predictions]
    # the limit for every run length: the fastest, then settings that start sooner
    timed = roofline.frontier(starts)
    runs = budget.run_range(
        spec,
        space,
        train_samples=len(prepared.task.train),
        fastest=timed[0][0].samples_per_second,
    )
    run_samples = end_to_end.run_length(*runs)
    checked = end_to_end.to_check(
        starts,
        samples=run_samples,
        count=end_to_end.CHECKED * (2 if device.type == "cpu" else 1),
        within=runs,
    )
    # one at a time, as the loaders: side by side, each one's workers would refill their queue
    # while another is timed; soonest first, and none that one measured already outruns
    ends = measured(
        throughput.measure_in_turn,
        {str(i): config(p.setting) for i, (p, _) in enumerate(checked)},
        {
            str(i): p.loader_rate / p.compute_rate
            for i, (p, _) in enumerate(checked)
            if p.overlapped
        },
        end_to_end.Outrun(
            {str(i): (p.samples_per_second, start) for i, (p, start) in enumerate(checked)},
            within=runs,
        ),
    )
    bar.update(len(checked))
    # start-up as measured apart: the end-to-end windows begin after it
    speeds = [(p, ends[str(i)].samples_per_second, start) for i, (p, start) in enumerate(checked)]
    if not any(speed for _, speed, _ in speeds):
        return {**_nothing_settled(batch, space, "no setting ran end to end"), **figures}
    chosen, speed = end_to_end.decide(speeds, samples=run_samples)
    fixed = {k: chosen.compute[k] for k in roofline.MEASURED_FORMATS}
    peaks = [rate.get("peak_memory_bytes") for rate in figures["compute_rates"]]
    memory = roofline.checkpointing_fit(
        space, peaks, batch=batch, device_bytes=telemetry.memory_bytes(device)
    )
    if memory is not None and memory["fits"]:
        fixed["checkpointing"] = False
    compiled = None
    if set(space["compile"].values) == {False, True}:
        started = time.monotonic()
        compiled = chosen_setting.weigh_compile(
            spec, prepared, chosen, config({**chosen.setting, "compile": False}), seed=seed
        )
        if "unmeasured" not in compiled:
            phases["compile"] = time.monotonic() - started
        bar.update(2)
        if not compiled["kept"]:
            fixed["compile"] = False
    batches = throughput_phase.table_batches(
        spec, space, prepared.baseline, batch_norm=prepared.batch_norm
    )
    others = [b for b in batches if b != batch]
    precisions = _precisions_kept(chosen, speeds, space)
    # a goodput trial trains its maths at any precision kept: each one's table of its own
    wanted = (
        {p: sorted({batch, *batches}) for p in precisions if p != chosen.compute["precision"]}
        if spec.objective == GOODPUT
        else None
    )
    entries = chosen_setting.at_batches(
        lambda work, *args: measured(work, *args, phase="batches"),
        chosen,
        speed,
        others,
        config,
        precisions=wanted,
    )
    bar.update(len(entries))
    at_batches = [e for e in entries if "precision" not in e]
    other_precisions = [e for e in entries if "precision" in e]
    return {
        "kind": "joint",
        "batch_size": batch,
        "shared_cores": device.type == "cpu",
        "loader": chosen.loader,
        "probed_loader": len(loaders) > 1,
        "precisions": precisions,
        "fixed": fixed,
        "speed": {},
        "runs": [],
        **figures,
        "checked": [
            {**p.figures(), "measured": m, "start_up": start, "reason": ends[str(i)].reason}
            for i, (p, m, start) in enumerate(speeds)
        ],
        # the run the setting was chosen for, between the shortest and the longest a trial trains
        "run_samples": run_samples,
        "run_range": list(runs),
        "limit": timed[0][0].figures(),
        "frontier": [p.figures() for p, _ in timed],
        # checkpointing as measured (the baseline's): a trial with another recomputes otherwise
        "chosen": {
            **chosen.figures(),
            "measured": speed,
            "checkpointing": config(chosen.setting).checkpointing,
        },
        # levers as the study file asked: one fitted away (no 2-D convolution) moves nothing
        "moves": roofline_text.what_moves_it(
            timed[0][0],
            spec.space,
            batch=batch,
            cores=cpu_count(),
            step_rates={
                batch: chosen.compute_rate,
                **{e["batch_size"]: e["compute_rate"] for e in at_batches if e.get("compute_rate")},
            },
        ),
        "batches": at_batches,
        **({"precision_batches": other_precisions} if other_precisions else {}),
        **({"compile": compiled} if compiled else {}),
        **({"checkpointing": memory} if memory else {}),
    }


def _precisions_kept(
    chosen: roofline.Prediction,
    speeds: list[tuple[roofline.Prediction, float | None, float]],
    space: Space,
) -> list[str]:
    """The chosen setting's precision, and every other that ran faster end to end at its loader,
    the search then weighing its speed against its effect on convergence. One left unmeasured
    there (outrun over every run the study trains: end_to_end.Outrun) cannot win: dropped."""
    at_loader = [(p, speed) for p, speed, _ in speeds if speed and p.loader == chosen.loader]
    slowest = min(speed for _, speed in at_loader)
    kept = {chosen.compute["precision"]} | {
        p.compute["precision"] for p, speed in at_loader if speed >= (1 + probe.FASTER_BY) * slowest
    }
    return [p for p in space["precision"].values if p in kept]


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
