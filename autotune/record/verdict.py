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

from autotune.record import objectives
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
) -> dict[str, dict[str, Any]]:
    """Per label: median time (a run that missed counts as infinitely slow), spread, runs.

    time_to_target: a run's time to target; it missed when it did not reach the target.
    fixed_schedule: a run's whole-schedule time; it missed when it failed or the time limit cut
    it short, and every run counts as missed when the mean final metric is under `target`.
    """
    by_label: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_label.setdefault(record["label"], []).append(record)
    summary = {}
    # the baseline first, as the yardstick, though it runs last on each seed
    for label, runs in sorted(by_label.items(), key=lambda item: item[0] != BASELINE):
        times, mean_final = objectives.of(objective).confirmed_times(runs, target=target)
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


def winner(summary: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The label with the smallest median, the baseline included; None if none reached the target.

    The baseline is a candidate like the others: when no configuration the study found beats it
    on fresh seeds, a single lucky run won the study and the baseline is what to keep. Ties (a
    median can be the same run's time) go to the one that missed the target less often, then to
    the baseline, which the user already has.
    """
    timed = {
        k: v for k, v in summary.items() if v["median"] is not None and not k.endswith(IN_FP32)
    }
    if not timed:
        return None
    return min(
        timed,
        key=lambda k: (timed[k]["median"], timed[k]["runs"] - timed[k]["reached"], k != BASELINE),
    )


def speedup(summary: Mapping[str, Mapping[str, Any]], label: str) -> float | None:
    """Baseline median over the candidate's median: how many times faster the candidate is."""
    base = summary.get(BASELINE, {}).get("median")
    mine = summary.get(label, {}).get("median")
    return base / mine if base and mine else None
