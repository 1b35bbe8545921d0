"""What a trial's time is, and whether it is feasible, from its runs: one per seed (replicate).

The objectives (spec/study_file.OBJECTIVES), each a small object with its rules:

- time_to_target: each run stops at the first evaluation that reaches the target. The trial is
  feasible when every run reached it; its time is their mean time to target. Only a contender
  gets the extra seeds: a trial whose first run would be the study's new best (`runs_for`).
- fixed_schedule (airbench): each run trains its whole schedule, so its time is steps x step
  time, far less noisy than a crossing. The trial is feasible when the mean final metric over its
  runs reaches the target; its time is their mean training time.
- goodput: each run stops at the target, as under time_to_target, but the trial's time is
  predicted from the samples its runs needed and the speed of the fastest systems setting that
  trains its maths (probe/model/goodput.py): `predict` turns samples into seconds. A busy machine
  slows the runs, never the samples, so it cannot change the answer. Its seeds are paired: every
  trial's k-th run has the same seed, so trials differ by their configuration alone.

Plain methods over `TrialResult`s, so the rules are testable without training anything.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from autotune.spec.sections import reaches, shortfall
from autotune.spec.study_file import FIXED_SCHEDULE, GOODPUT, SYSTEMS_ONLY, TIME_TO_TARGET

if TYPE_CHECKING:  # a run's fields are read, nothing is built: no training machinery is loaded
    from autotune.train.config import TrialResult

# The least constraint of a trial that is infeasible whatever its metric says: a replicate that
# missed the target (time_to_target), a schedule the time limit cut short (fixed_schedule).
CUT_SHORT = 1e-9


@dataclasses.dataclass(frozen=True)
class Outcome:
    value: float  # seconds: what the study minimizes
    constraint: float  # feasible when <= 0 (Optuna's convention)
    # the metric the constraint judges: the worst best (time_to_target), the mean final
    # (fixed_schedule)
    metric: float


Predict = Callable[[float], float]  # samples to target -> predicted seconds (goodput)


class Objective(Protocol):
    """One objective's rules: how many runs a trial gets, and its time and constraint from them."""

    name: str
    stops_at_target: bool  # each run stops at the first evaluation that reaches the target
    metric: str  # the run figure feasibility is judged by
    metric_label: str  # how reports name it, before the metric's name
    paired: bool  # every trial's runs share their seeds

    def first_runs(self, replicates: int) -> int: ...
    def runs_for(
        self,
        first: TrialResult,
        *,
        replicates: int,
        incumbent: float | None,
        predict: Predict | None = None,
    ) -> int: ...
    def outcome(
        self,
        runs: Sequence[TrialResult],
        *,
        target: float,
        predict: Predict | None = None,
        minimize: bool = False,
    ) -> Outcome: ...
    def confirmed_times(
        self, runs: Sequence[Mapping[str, Any]], *, target: float | None, minimize: bool = False
    ) -> tuple[list[float], float | None]: ...


class TimeToTarget:
    name, stops_at_target, metric, metric_label, paired = (
        TIME_TO_TARGET,
        True,
        "best_metric",
        "",
        False,
    )

    def first_runs(self, replicates: int) -> int:
        return 1

    def time(self, runs: Sequence[TrialResult], predict: Predict | None) -> float:
        """The time of runs that all reached the target: their mean time to target."""
        return statistics.fmean(r.time_to_target for r in runs)

    def runs_for(
        self,
        first: TrialResult,
        *,
        replicates: int,
        incumbent: float | None,
        predict: Predict | None = None,
    ) -> int:
        """The extra seeds go where the decision is close, to a first run that beat the best time
        so far (or set the first one): a lucky seed would otherwise become the bar every later
        trial is pruned against. Any other first run is the trial's only one."""
        contender = first.reached and (incumbent is None or self.time([first], predict) < incumbent)
        return replicates if contender else 1

    def outcome(
        self,
        runs: Sequence[TrialResult],
        *,
        target: float,
        predict: Predict | None = None,
        minimize: bool = False,
    ) -> Outcome:
        """Feasible when every run reached the target; the time is `time` of them (their mean time
        to target). A trial that missed is timed by its mean training time: infeasible whatever it
        is. `minimize`: the metric is lower-is-better."""
        bests = [r.best_metric for r in runs]
        worst = max(bests) if minimize else min(bests)
        short = shortfall(worst, target, minimize=minimize)
        if all(r.reached for r in runs):
            return Outcome(self.time(runs, predict), short, worst)
        return Outcome(
            statistics.fmean(r.train_seconds for r in runs), max(short, CUT_SHORT), worst
        )

    def confirmed_times(
        self, runs: Sequence[Mapping[str, Any]], *, target: float | None, minimize: bool = False
    ) -> tuple[list[float], float | None]:
        """A run's time to target; it missed (infinitely slow) when it did not reach the target."""
        return [r["time_to_target"] if r["reached"] else math.inf for r in runs], None


class FixedSchedule:
    name, stops_at_target, metric, metric_label, paired = (
        FIXED_SCHEDULE,
        False,
        "final_metric",
        "mean final ",
        False,
    )

    def first_runs(self, replicates: int) -> int:
        return replicates  # feasibility is a mean over them all

    def runs_for(
        self,
        first: TrialResult,
        *,
        replicates: int,
        incumbent: float | None,
        predict: Predict | None = None,
    ) -> int:
        return replicates

    def outcome(
        self,
        runs: Sequence[TrialResult],
        *,
        target: float,
        predict: Predict | None = None,
        minimize: bool = False,
    ) -> Outcome:
        """Feasible when the mean final metric reaches the target and no run was cut short by the
        time limit; the time is their mean training time."""
        final = statistics.fmean(r.final_metric for r in runs)
        whole = all(r.stop_reason != "max_seconds" for r in runs)
        short = shortfall(final, target, minimize=minimize)
        constraint = short if whole else max(short, CUT_SHORT)
        return Outcome(statistics.fmean(r.train_seconds for r in runs), constraint, final)

    def confirmed_times(
        self, runs: Sequence[Mapping[str, Any]], *, target: float | None, minimize: bool = False
    ) -> tuple[list[float], float | None]:
        """A run's whole-schedule time; it missed when it failed or the time limit cut it short,
        and every run missed when the mean final metric does not reach `target`."""
        failed = math.inf if minimize else -math.inf  # a run with no final metric: the worst
        finals = [r["final_metric"] if r.get("final_metric") is not None else failed for r in runs]
        mean_final = statistics.fmean(finals)
        feasible = target is None or reaches(mean_final, target, minimize=minimize)
        times = [
            r["train_seconds"]
            if feasible
            and r.get("final_metric") is not None
            and r.get("stop_reason") != "max_seconds"
            else math.inf
            for r in runs
        ]
        return times, mean_final


class Goodput(TimeToTarget):
    name, paired = GOODPUT, True

    def time(self, runs: Sequence[TrialResult], predict: Predict | None) -> float:
        """The prediction for the runs' mean samples to target (one systems setting for them
        all)."""
        if predict is None or any(r.samples_to_target is None for r in runs):
            raise ValueError(
                "a goodput trial's time needs the samples its runs needed "
                "and a prediction from them"
            )
        return predict(statistics.fmean(r.samples_to_target for r in runs))


class SystemsOnly(Goodput):
    """Goodput's rules for the one trial that trains the baseline's maths; the study tells every
    other systems setting from its samples (probe/plan.py). Not paired: with one maths
    there is nothing to pair, and a try that missed the target trains again on seeds of its own
    (budget.py)."""

    name, paired = SYSTEMS_ONLY, False


OBJECTIVES: dict[str, Objective] = {
    o.name: o for o in (TimeToTarget(), FixedSchedule(), Goodput(), SystemsOnly())
}


def of(name: str) -> Objective:
    """The objective a study file names."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, but got {name!r}.")
    return OBJECTIVES[name]


def outcome(
    runs: Sequence[TrialResult],
    objective: Objective,
    *,
    target: float,
    predict: Predict | None = None,
    minimize: bool = False,
) -> Outcome:
    """The trial's time and constraint from its runs, under `objective`; `minimize`: the
    metric is lower-is-better."""
    if not runs:
        raise ValueError("a trial's outcome needs at least one run, but got runs=[].")
    return objective.outcome(runs, target=target, predict=predict, minimize=minimize)
