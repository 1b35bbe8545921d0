"""The probe's end-to-end checks: which settings it measures with the real pipeline, which it
need not, and which the measurements choose.

The rates measured apart predict every setting (roofline.py); the few predicted soonest
over the run the study is expected to train are then measured end to end, with the frontier's
settings that could win a run it might train, and what was measured decides, start-up counted:
the rates leave out what runs only when both run at once (the two sharing a CPU's cores, a copy
waiting for a step). A prediction is about a ceiling (a pipeline runs no faster than its slower
stage): a setting that a measured one beats over every run the study trains, even at twice its
predicted speed, is not measured.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.probe.model.roofline import INPUT, Prediction, crossing, frontier, timing

CHECKED = 3  # the settings predicted soonest over the run chosen for, measured end to end
TIE = 0.05  # times this close, from end-to-end speeds, are one time: the windows' noise
# A setting's end-to-end speed can come above its prediction where its rates apart were measured
# low (a host's other work slowing a loader's windows): on an H100, pinned loaders' came 1.30-1.55x
# theirs; elsewhere, 0.70-1.16x. One that a measured setting beats even at (1 + HEADROOM) times
# its predicted speed is not measured.
HEADROOM = 1.0
OUTRUN = "not measured:"  # how the reason for a setting outrun before its turn begins


def run_length(shortest: float, longest: float) -> float:
    """The run, in samples, the probe chooses a setting for, before any trial has trained: the
    middle on a log scale of the shortest run a trial trains and the longest. A trial's samples
    to target are unknown until one reaches it; the log-scale middle is within
    sqrt(longest / shortest) of every run the study can train, and a setting chosen for the wrong
    length loses least near where two settings cross."""
    return math.sqrt(max(1.0, min(shortest, longest)) * max(1.0, longest))


def to_check(
    timed: Sequence[tuple[Prediction, float]],
    *,
    samples: float,
    count: int = CHECKED,
    within: tuple[float, float],
) -> list[tuple[Prediction, float]]:
    """Of (prediction, start-up seconds) pairs, the `count` predicted soonest over a run of
    `samples` (start-up + samples / rate), then each setting of their frontier that is the
    fastest for some run `within` (shortest, longest) not among them: the fastest rate for the
    longest runs, one that starts sooner for the shortest. Where the loader holds the soonest,
    its loader with the fastest step as well: the rates predict every step that outpaces the
    loader alike, but end to end a step's own CPU work (launches, the optimizer) takes cores from
    the workers (on an H200, 16 pinned workers fed the fused fp16 step 48,354 samples/s and the
    unfused one 41,381). These are measured end to end, in this order: soonest first."""

    def seconds(pair: tuple[Prediction, float]) -> float:
        return pair[1] + samples / pair[0].samples_per_second

    ranked = sorted(timed, key=seconds)
    chosen = list(ranked[:count])
    soonest = ranked[0][0] if ranked else None
    if soonest is not None and soonest.bottleneck == INPUT:
        at_loader = [pair for pair in timed if pair[0].loader == soonest.loader]
        chosen.append(max(at_loader, key=lambda pair: pair[0].compute_rate))
    chosen += fastest_within(frontier(timed), *within)
    unique = [pair for index, pair in enumerate(chosen) if pair not in chosen[:index]]
    return sorted(unique, key=seconds)  # the soonest first: measured first, it bounds the rest


def fastest_within(
    kept: Sequence[tuple[Prediction, float]], shortest: float, longest: float
) -> list[tuple[Prediction, float]]:
    """Of a frontier (fastest first), the settings that are the fastest for some run of between
    `shortest` and `longest` samples: a setting that wins only runs shorter than the first
    evaluation, or longer than the budget allows, wins no run the study trains."""
    fastest = []
    for index, this in enumerate(kept):
        # fastest from where it overtakes the next (which starts sooner) to where the one before
        # (which trains faster) overtakes it
        below = crossing(timing(this), timing(kept[index + 1])) if index + 1 < len(kept) else 0
        above = crossing(timing(kept[index - 1]), timing(this)) if index else math.inf
        if below <= longest and above >= shortest:
            fastest.append(this)
    return fastest


def decide(
    checked: Sequence[tuple[Prediction, float | None, float]], *, samples: float
) -> tuple[Prediction, float]:
    """Of (prediction, speed measured end to end, start-up seconds measured apart) triples, the
    setting that finishes a run of `samples` soonest (start-up + samples / speed), with its
    measured speed; among those within TIE of it, the one with the fastest step: held by the same
    loader they measure alike, and the faster step runs ahead wherever batches wait (after each
    evaluation, the clock paused while the workers loaded)."""
    timed = [
        (p, speed, start + samples / speed)
        for p, speed, start in checked
        if speed and math.isfinite(speed)
    ]
    if not timed:
        raise ValueError("no setting ran end to end")
    soonest = min(seconds for _, _, seconds in timed)
    tied = [(p, speed) for p, speed, seconds in timed if seconds <= (1 + TIE) * soonest]
    return max(tied, key=lambda pair: pair[0].compute_rate)


def outrun_by(
    candidate: tuple[float, float],
    measured: Sequence[tuple[float, float]],
    *,
    within: tuple[float, float],
) -> tuple[float, float] | None:
    """Of `measured` settings, each (samples a second end to end, start-up seconds), one that
    finishes every run of `within` (shortest, longest) samples sooner than `candidate` (samples a
    second predicted, start-up seconds) could at HEADROOM above its prediction; None if none
    does. Times are linear in the samples, so sooner at both ends is sooner everywhere between."""
    speed, start = candidate
    best = speed * (1 + HEADROOM)

    def sooner(other: tuple[float, float], samples: float) -> bool:
        return other[1] + samples / other[0] < start + samples / best

    return next((m for m in measured if m[0] and all(sooner(m, n) for n in within)), None)


@dataclasses.dataclass(frozen=True)
class Outrun:
    """For measuring in turn (probe/throughput.py's `needless`): why a setting need not be
    measured end to end, given those measured before it, or None to measure it. `timings`: each
    key's predicted samples a second and start-up seconds (measured apart)."""

    timings: Mapping[Any, tuple[float, float]]
    within: tuple[float, float]

    def __call__(self, key: Any, results: Mapping[Any, Any]) -> str | None:
        measured = [
            (result.samples_per_second, self.timings[done][1])
            for done, result in results.items()
            if result.samples_per_second
        ]
        by = outrun_by(self.timings[key], measured, within=self.within)
        if by is None:
            return None
        return (
            f"{OUTRUN} even at {1 + HEADROOM:g}x its predicted {self.timings[key][0]:,.0f} "
            f"samples/s it would finish every run the study trains later than a setting measured "
            f"at {by[0]:,.0f}/s"
        )


def precisions_kept(
    chosen: Prediction,
    checked: Sequence[tuple[Prediction, float | None, float]],
    precisions: Sequence[str],
    *,
    faster_by: float,
) -> list[str]:
    """Of `precisions` (the space's, in its order), the chosen setting's and every other that ran
    `faster_by` faster end to end at its loader, the search then weighing its speed against its
    effect on convergence. One left unmeasured there (Outrun) cannot win: dropped."""
    at_loader = [(p, speed) for p, speed, _ in checked if speed and p.loader == chosen.loader]
    slowest = min(speed for _, speed in at_loader)
    kept = {chosen.compute["precision"]} | {
        p.compute["precision"] for p, speed in at_loader if speed >= (1 + faster_by) * slowest
    }
    return [p for p in precisions if p in kept]
