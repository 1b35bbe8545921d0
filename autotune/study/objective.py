"""What a trial's time is, and whether it is feasible, from its runs: one per seed (replicate).

Two objectives (spec.OBJECTIVES):

- time_to_target: each run stops at the first evaluation that reaches the target. The trial is
  feasible when every run reached it; its time is their mean time to target. Only a contender
  gets the extra seeds: a trial whose first run would be the study's new best (`runs_for`).
- fixed_schedule (airbench): each run trains its whole schedule, so its time is steps x step
  time, far less noisy than a crossing. The trial is feasible when the mean final metric over its
  runs reaches the target; its time is their mean training time.

Plain functions over `trial.TrialResult`s, so the rule is testable without training anything.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from autotune.train.trial import TrialResult

# Replicate k of a trial runs on the trial's seed + k * REPLICATE_STRIDE: far past every seed a
# study gives a trial, the confirmation or the probe (study seed * 100,000 + under 100,000).
REPLICATE_STRIDE = 10**12
# The least constraint of a trial that is infeasible whatever its metric says: a replicate that
# missed the target (time_to_target), a schedule the time limit cut short (fixed_schedule).
CUT_SHORT = 1e-9


@dataclasses.dataclass(frozen=True)
class Outcome:
    value: float  # seconds: what the study minimizes
    constraint: float  # feasible when <= 0 (Optuna's convention)
    metric: float  # the metric the constraint judges: the worst best (time_to_target), the mean final (fixed_schedule)


def seeds(trial_seed: int, replicates: int) -> list[int]:
    """The seeds of a trial's runs; the first is the trial's own."""
    return [trial_seed + k * REPLICATE_STRIDE for k in range(replicates)]


def runs_for(first: TrialResult, *, objective: str, replicates: int, incumbent: float | None) -> int:
    """How many runs a trial gets, decided once its first run finished.

    fixed_schedule: always `replicates`, since feasibility is a mean. time_to_target: the extra
    seeds go where the decision is close, to a first run that beat the best time so far (or
    set the first one): a lucky seed would otherwise become the bar every later trial is
    pruned against. Any other first run is the trial's only one.
    """
    if objective == "fixed_schedule":
        return replicates
    contender = first.reached and (incumbent is None or first.time_to_target < incumbent)
    return replicates if contender else 1


def outcome(runs: Sequence[TrialResult], *, objective: str, target: float) -> Outcome:
    """The trial's time and constraint from its runs."""
    if not runs:
        raise ValueError("a trial's outcome needs at least one run, but got runs=[].")
    if objective == "time_to_target":
        worst = min(r.best_metric for r in runs)
        if all(r.reached for r in runs):
            return Outcome(statistics.fmean(r.time_to_target for r in runs), target - worst, worst)
        return Outcome(statistics.fmean(r.train_seconds for r in runs), max(target - worst, CUT_SHORT), worst)
    if objective == "fixed_schedule":
        final = statistics.fmean(r.final_metric for r in runs)
        whole = all(r.stop_reason != "max_seconds" for r in runs)  # the time limit cut a schedule short
        constraint = target - final if whole else max(target - final, CUT_SHORT)
        return Outcome(statistics.fmean(r.train_seconds for r in runs), constraint, final)
    raise ValueError(f"objective must be one of time_to_target, fixed_schedule, but got {objective=}.")


def summary(run: TrialResult, seed: int) -> dict[str, object]:
    """One replicate as the trial stores it beside its first run's full record."""
    return {"seed": seed, "train_seconds": run.train_seconds, "time_to_target": run.time_to_target,
            "best_metric": run.best_metric, "final_metric": run.final_metric, "stop_reason": run.stop_reason}
