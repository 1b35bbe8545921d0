"""What the joint probe measures of the setting it chose (run.py), once chosen:
torch.compile's cost against what it saves, and the setting's two rates at the space's other
micro-batches, so that a trial at any of them has a predicted time; and, once a trial has
reached the target, the setting the trials after it train at (for_run).

The probe chooses at one micro-batch; the search then samples others. A step's rate grows with
its batch (a GPU's kernels fill, per-step costs spread) and a loader's falls at small ones (a
batch handed over per worker round trip), so the chosen setting's rates are measured again at
each: its compute and its loader at each batch in turn, one measurement each, not one per
combination, and then the setting end to end at each, which is what a trial there is expected to
train: what the rates apart leave out is not the same share at every batch (on an H200, beside
16 loader workers on 16 cores, a setting ran 0.6x the slower of its rates apart at batch 256 and
0.9x at 512). Under goodput a trial may train any precision the
probe kept: each other one's step is measured at every batch too, beside the same loader, and
scaled as the chosen setting's end-to-end check found.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.probe import rates, throughput
from autotune.probe.measuring import Measuring
from autotune.probe.model import roofline
from autotune.probe.model.figures import setting_for_run
from autotune.probe.rates_apart import queue_stays_full
from autotune.runners import isolation
from autotune.search.space import LOADER_KNOBS, Space
from autotune.spec.study_file import StudySpec
from autotune.train.config import TrialConfig


def at_batches(
    measured: Callable[..., dict[str, rates.Rate]],
    chosen: roofline.Prediction,
    speed: float,
    batches: Sequence[int],
    config: Callable[[dict[str, Any]], TrialConfig],
    *,
    precisions: Mapping[str, Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """The chosen setting at each of `batches` (not the probe's own: measured already): its
    loader's and compute's rates there, the speed they predict, and its speed measured end to end
    there (`measured`), the speed to expect (`expected`); where that has no figure, the predicted
    speed as the end-to-end check at the probe's batch (`speed`) found the prediction. A batch out
    of memory is a result. With `precisions` (another precision -> its batches), that
    precision's step at the chosen formats and loader too, at each of its batches, its entries
    naming it (`precision`): the same loader's rate, the scaled prediction.
    `measured(work, *args)` runs one of rates.py's or throughput.py's measurements."""
    wanted = {(None, b) for b in batches} | {
        (p, b) for p, theirs in (precisions or {}).items() for b in theirs
    }
    if not wanted:
        return []

    def key(precision: str | None, batch: int) -> str:
        return f"{precision}@{batch}" if precision else str(batch)

    steps_of = {
        key(p, b): config({**chosen.setting, "batch_size": b, **({"precision": p} if p else {})})
        for p, b in wanted
    }
    try:
        # one at a time: beside the others, a batch's peak and out of memory would be theirs too
        steps = measured(rates.measure_in_groups, steps_of, 1)
        # a batch whose steps do not run needs no loader; the loader is the same at any precision
        fed = {
            str(b): config({**chosen.setting, "batch_size": b})
            for b in sorted({b for p, b in wanted if steps[key(p, b)].samples_per_second})
        }
        loads = measured(rates.measure_loaders_in_turn, fed, None) if fed else {}
        own = {b: c for b, c in fed.items() if (None, int(b)) in wanted}
        ends = _end_to_end(measured, chosen, own, steps, loads)
    except isolation.TrialFailure as failure:
        # the choice stands: only these batches go without a prediction
        why = f"a measurement failed: {failure.reason}"
        return [
            {**({"precision": p} if p else {}), "batch_size": b, "oom": False, "reason": why}
            for p, b in sorted(wanted, key=lambda w: (w[0] or "", w[1]))
        ]
    return [
        _entry(
            chosen,
            speed,
            p,
            b,
            steps[key(p, b)],
            loads.get(str(b)),
            None if p else ends.get(str(b)),
        )
        for p, b in sorted(wanted, key=lambda w: (w[0] or "", w[1]))
    ]


def _end_to_end(
    measured: Callable[..., dict[str, Any]],
    chosen: roofline.Prediction,
    fed: Mapping[str, TrialConfig],
    steps: Mapping[str, rates.Rate],
    loads: Mapping[str, rates.Rate],
) -> dict[str, throughput.Throughput]:
    """The chosen setting end to end at each batch of `fed` (its step ran there) whose loader ran
    too, one at a time (as the probe's own check: side by side, one's workers would refill their
    queue while another is timed)."""
    ran = {b: c for b, c in fed.items() if loads.get(b) and loads[b].samples_per_second}
    if not ran:
        return {}
    held = {
        b
        for b in ran
        if queue_stays_full(
            dataclasses.replace(
                chosen,
                loader_rate=loads[b].samples_per_second,
                compute_rate=steps[b].samples_per_second,
            )
        )
    }
    return measured(throughput.measure_in_turn, dict(ran), None, held)


def _entry(
    chosen: roofline.Prediction,
    speed: float,
    precision: str | None,
    batch: int,
    step: rates.Rate,
    load: rates.Rate | None,
    end: throughput.Throughput | None = None,
) -> dict[str, Any]:
    """One batch's (and precision's) entry from its step's and loader's rates and its end-to-end
    speed (`end`): the speed to expect is the measured one, else their prediction scaled as the
    chosen setting's end-to-end check found; or why there is none."""
    entry: dict[str, Any] = {
        **({"precision": precision} if precision else {}),
        "batch_size": batch,
        "peak_memory_bytes": step.peak_memory_bytes,
    }
    if step.oom or not step.samples_per_second:
        return {**entry, "oom": step.oom, "reason": step.reason or "no compute rate"}
    if load is None or not load.samples_per_second:
        why = (load and load.reason) or "no loader rate"
        return {**entry, "oom": False, "compute_rate": step.samples_per_second, "reason": why}
    figures = roofline.at_batch(
        chosen, speed, loader_rate=load.samples_per_second, compute_rate=step.samples_per_second
    )
    if end is not None and end.samples_per_second:
        rate = end.samples_per_second
        figures = {**figures, "measured": rate, "expected": rate}
    return {
        **entry,
        "oom": False,
        "fixed_seconds": load.fixed_seconds + step.fixed_seconds,
        **figures,
    }


def weigh_compile(
    measured: Callable[..., dict[str, rates.Rate]],
    spec: StudySpec,
    prepared: Measuring,
    chosen: roofline.Prediction,
    plain: TrialConfig,
) -> dict[str, Any]:
    """torch.compile measured once, on the chosen setting's step beside the same step uncompiled:
    what it costs at start-up and what it saves a sample at the chosen loader. It stays in the
    search only where it pays back within the longest trial the budget allows (a trial that
    reaches the target sooner may still not win it back: the search weighs that, compile time
    being on its clock); elsewhere every trial that sampled it would pay the compile for nothing.
    `measured(work, *args)` runs rates.py's measurement where the study measures."""
    assert prepared.task is not None
    longest = spec.budget.max_epochs * len(prepared.task.train)
    if chosen.bottleneck == roofline.INPUT and prepared.device.type != "cpu":
        # a faster step cannot raise a rate the loader holds (on a CPU, compiling may leave the
        # loader cores: there it is measured)
        return {"kept": False, "unmeasured": roofline.INPUT, "longest_samples": longest}
    try:
        compiled = dataclasses.replace(plain, compile=True)
        figures = measured(rates.measure, {}, {"plain": plain, "compiled": compiled})
    except isolation.TrialFailure as failure:
        return {"kept": False, "failed": failure.reason, "longest_samples": longest}
    rate, base = figures["compiled"], figures["plain"]
    if not (rate.samples_per_second and base.samples_per_second):
        why = f"its step could not be measured ({rate.reason or base.reason or 'no figure'})"
        return {"kept": False, "failed": why, "longest_samples": longest}
    # The chosen setting's loader with each step rate: both from this pair, measured side by side.
    at_loader = dataclasses.replace(chosen, compute_rate=base.samples_per_second)
    payback = roofline.payback(
        at_loader,
        compute_rate=rate.samples_per_second,
        once_seconds=rate.fixed_seconds - base.fixed_seconds,
    )
    return {
        "once_seconds": payback.once_seconds,
        "speed": payback.speed,
        "faster": payback.faster,
        "samples": payback.samples,
        "longest_samples": longest,
        "kept": payback.pays_within(longest),
    }


def for_run(
    outcome: Mapping[str, Any], space: Space, config: Mapping[str, Any], samples: float | None
) -> dict[str, Any]:
    """`config` at the setting the joint probe checked that is soonest over a run of `samples`
    (the incumbent's samples to the target), where that is clearly sooner than the one it has
    (figures.setting_for_run). The probe chose for a run length it could only estimate
    from the budget; once a trial has reached the target the study knows one. Only the knobs the
    probe fixed move (its loader and its step's formats), never the precision nor anything the
    sampler chose, and only where all of them are fixed: `config` as it is otherwise."""
    if not samples or not math.isfinite(samples):  # no trial has reached it, or none counted
        return dict(config)
    if outcome.get("kind") != "joint" or not outcome.get("chosen"):
        return dict(config)
    if (outcome.get("paired") or {}).get("kept") == "baseline":
        return dict(config)  # no setting was shown faster than the baseline's beside it
    setting = setting_for_run(outcome, samples, config)
    if setting is None:
        return dict(config)
    probed = [k for k in (*LOADER_KNOBS, *outcome.get("fixed", {})) if k in setting]
    fixed = space.fixed()
    # prefetch_factor stays unfixed where the probe chose no workers
    if any(k not in fixed for k in probed if k != "prefetch_factor"):
        return dict(config)  # a knob the sampler chooses: the rest alone would be no setting
    moved = {k: setting[k] for k in probed if k in fixed}
    if moved.get("num_workers") and config.get("prefetch_factor") is None:
        moved["prefetch_factor"] = setting["prefetch_factor"]  # workers queue what was measured
    return {**config, **moved}
