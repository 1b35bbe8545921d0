"""What a confirmation means: the candidates' labels, each label's median over its fresh seeds, the
winner and its speedup over the baseline, and what a narrower precision did to convergence.

A single time to target is a noisy sample (one digits configuration ranged 0.8-4.5 s over five
seeds), so the winner is named by its median over fresh seeds, measured interleaved with the
baseline (study/confirm.py) so that both see the same machine load. Under the fixed_schedule
objective a configuration's time is that of its whole schedule, and it counts only when its mean
final metric over the fresh seeds reaches the target (objectives.py).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.record import lead, objectives
from autotune.spec.study_file import TIME_TO_TARGET

BASELINE = "baseline"
# confirm.baseline: until_resolved. The baseline's runs are usually the study's longest; once it
# has run on MIN_BASELINE_RUNS seeds and every one of its runs took RESOLVED_BY times the slowest
# run of every candidate (or missed the target), more of its runs cannot change which is faster:
# the candidates go on to their seeds, the baseline does not. One run is enough where it took
# RESOLVED_ALONE times as long, once every candidate has run twice: beyond the spread of one
# configuration's times across seeds (on a GPU study, where the winner is 5-10x faster, that
# saves a baseline run of half a minute).
MIN_BASELINE_RUNS = 2
RESOLVED_BY = 1.25
RESOLVED_ALONE = 2.0


def resolved_by(baseline_runs: int) -> float:
    """How many times the slowest candidate run each of `baseline_runs` runs must take."""
    return RESOLVED_ALONE if baseline_runs < MIN_BASELINE_RUNS else RESOLVED_BY


def baseline_resolved(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the baseline's runs so far are told apart from every candidate's (time to target)."""
    base = [r for r in records if r["label"] == BASELINE]
    others = [r for r in records if r["label"] != BASELINE]
    if not base or not others or not all(r["reached"] for r in others):
        return False
    runs_each = Counter(r["label"] for r in others)
    if len(base) < MIN_BASELINE_RUNS and min(runs_each.values()) < MIN_BASELINE_RUNS:
        return False
    slowest = max(r["time_to_target"] for r in others)
    ratio = resolved_by(len(base))
    return all(not r["reached"] or r["time_to_target"] >= ratio * slowest for r in base)


def label(number: int) -> str:
    """Study trial `number`'s name among the candidates (the baseline's is BASELINE)."""
    return f"trial {number}"


# a twin's label: a trial's maths in float32 (confirm.precision), never a winner itself
IN_FP32 = " in fp32"


def fp32_twin(label_: str, config: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """`trial 4 in fp32` and trial 4's configuration in full float32 (TF32 off), where trial 4
    trains in a narrower precision: its samples to target beside the trial's measure what the
    precision does to convergence. None where it already trains in fp32."""
    if config["precision"] == "fp32":
        return None
    return label_ + IN_FP32, {**config, "precision": "fp32", "tf32": False}


def precision_effect(
    records: Sequence[Mapping[str, Any]], label_: str, precision: str
) -> dict[str, Any] | None:
    """The samples `label_` needed to reach the target over those its fp32 twin needed, on the seeds
    where both reached it: the median of the two medians' ratio, with the pairs it rests on."""
    by_seed: dict[int, dict[str, int]] = {}
    for record in records:
        if (
            record["label"] in (label_, label_ + IN_FP32)
            and record.get("reached")
            and record.get("samples_to_target")
        ):
            by_seed.setdefault(record["seed"], {})[record["label"]] = record["samples_to_target"]
    pairs = [(both[label_], both[label_ + IN_FP32]) for both in by_seed.values() if len(both) == 2]
    if not pairs:
        return None
    narrow, full = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    return {
        "trial": label_,
        "precision": precision,
        "samples": narrow,
        "fp32_samples": full,
        "ratio": narrow / full,
        "pairs": len(pairs),
    }


def stats(
    records: Sequence[Mapping[str, Any]],
    *,
    objective: str = TIME_TO_TARGET,
    target: float | None = None,
    minimize: bool = False,
) -> dict[str, dict[str, Any]]:
    """Per label: median time (a run that missed counts as infinitely slow), spread, runs.

    time_to_target: a run's time to target; it missed when it did not reach the target.
    fixed_schedule: a run's whole-schedule time; it missed when it failed or the time limit cut
    it short, and every run counts as missed when the mean final metric does not reach `target`
    (at or below it, `minimize`).
    """
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_label.setdefault(record["label"], []).append(record)
    summary = {}
    # the baseline first, as the yardstick, though it runs last on each seed
    for label, runs in sorted(by_label.items(), key=lambda item: item[0] != BASELINE):
        times, mean_final = objectives.of(objective).confirmed_times(
            runs, target=target, minimize=minimize
        )
        reached = [t for t in times if math.isfinite(t)]
        median = statistics.median(times)
        summary[label] = {
            "median": median if math.isfinite(median) else None,
            "min": min(reached) if reached else None,
            "max": max(reached) if reached else None,
            "runs": len(runs),
            "reached": len(reached),
        }
        if mean_final is not None:
            summary[label]["mean_final_metric"] = mean_final if math.isfinite(mean_final) else None
    return summary


# What a confirmation decided (`decide`), as stored in the Summary and the JSON report.
FASTER = "faster"  # a candidate resolved faster than the baseline: it is the winner
NOT_RESOLVED = "not_resolved"  # the leader's lead is inside the noise: keep the baseline
NOT_FASTER = "not_faster"  # the baseline is resolved at least as fast as every candidate
MISSED = "missed"  # no candidate reached the target on most seeds, and as often as the baseline


def times(
    records: Sequence[Mapping[str, Any]],
    label_: str,
    *,
    objective: str,
    target: float | None,
    minimize: bool = False,
) -> list[float]:
    """Each fresh-seed run's time of `label_`; math.inf for a run that missed."""
    runs = [r for r in records if r["label"] == label_]
    if not runs:
        return []
    return objectives.of(objective).confirmed_times(runs, target=target, minimize=minimize)[0]


def decide(
    records: Sequence[Mapping[str, Any]],
    *,
    objective: str = TIME_TO_TARGET,
    target: float | None = None,
    seeds: int | None = None,
    interval: bool = True,
    minimize: bool = False,
) -> dict[str, Any]:
    """The confirmation's verdict: a candidate wins only where it reached the target on more than
    half of its fresh seeds and on no fewer than the baseline, and the rank test of lead.py
    resolves it faster (at lead.ALPHA on the `seeds` every candidate ran; at lead.ALPHA_ADDED once
    seeds were added to it, as each look at the runs is another chance to be fooled); otherwise
    the baseline is the answer, and `outcome` says why.

    The leader is the candidate given added seeds, else the one with the smallest median among
    those allowed to win. The seeds the baseline skipped (confirm.baseline: until_resolved, once
    each of its runs was slower than every candidate's) count as runs slower than all of theirs.
    """
    stats_ = stats(records, objective=objective, target=target, minimize=minimize)
    base = stats_.get(BASELINE)
    seeds = seeds if seeds is not None else max((v["runs"] for v in stats_.values()), default=0)
    allowed = {
        k: v
        for k, v in stats_.items()
        if k != BASELINE
        and not k.endswith(IN_FP32)
        and 2 * v["reached"] > v["runs"]
        and (base is None or v["reached"] >= base["reached"])
    }
    candidates = sum(k != BASELINE and not k.endswith(IN_FP32) for k in stats_)
    if not allowed:  # none reached often enough; or the study's fastest was the baseline itself
        return {"outcome": MISSED if candidates else NOT_FASTER, "winner": BASELINE, "leader": None}
    leader = min(
        allowed,
        key=lambda k: (
            allowed[k]["runs"] <= seeds,  # the one given added seeds stays the leader
            allowed[k]["median"],
            allowed[k]["runs"] - allowed[k]["reached"],
        ),
    )
    mine = times(records, leader, objective=objective, target=target, minimize=minimize)
    base_times = times(records, BASELINE, objective=objective, target=target, minimize=minimize)
    if base_times:  # the seeds it skipped, as runs slower than every one of the leader's
        slowest = max(t for t in mine if math.isfinite(t))
        base_times += [slowest * RESOLVED_BY] * max(0, len(mine) - len(base_times))
    # On the first seeds each candidate was a chance for a lucky one to lead: the level is shared
    # among them. Added seeds are the leader's alone.
    level = lead.ALPHA / candidates if len(mine) <= seeds else lead.ALPHA_ADDED
    p = lead.p_faster(mine, base_times)
    if p <= level:
        outcome = FASTER
    elif not base_times or (
        lead.p_faster(base_times, mine) <= level
        or statistics.median(base_times) <= statistics.median(mine)
    ):
        outcome = NOT_FASTER
    else:
        outcome = NOT_RESOLVED
    bounds = lead.speedup_interval(mine, base_times) if interval else None
    return {
        "outcome": outcome,
        "winner": leader if outcome == FASTER else BASELINE,
        "leader": leader,
        "p_value": p,
        "level": level,
        "speedup": _ratio(statistics.median(base_times), statistics.median(mine))
        if base_times
        else None,
        # JSON has no infinity: an unbounded end (the baseline's median a miss) is null
        "interval": None if bounds is None else [_finite(end) for end in bounds],
    }


def more_seeds_for(decision: Mapping[str, Any]) -> list[str]:
    """confirm.runs: auto: the labels to run on one more fresh seed, the leader and the baseline,
    while the leader's lead is not resolved either way; none once it is."""
    return [decision["leader"], BASELINE] if decision["outcome"] == NOT_RESOLVED else []


def _ratio(base: float, mine: float) -> float | None:
    """The speedup of medians; None where a median is a miss (no number to divide)."""
    return None if math.isinf(mine) or math.isinf(base) else base / mine


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def speedup(summary: Mapping[str, Mapping[str, Any]], label: str) -> float | None:
    """Baseline median over the candidate's median: how many times faster the candidate is."""
    base = summary.get(BASELINE, {}).get("median")
    mine = summary.get(label, {}).get("median")
    return base / mine if base and mine else None
