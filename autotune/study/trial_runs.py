"""The runs of one trial: one per seed it gets, on the objective's clock, stopped once the trial
can no longer beat the incumbent.

one_trial.py asks for the configuration and tells the outcome; this trains it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune import progress, signals
from autotune.record.objectives import Predict
from autotune.runners import isolation
from autotune.train.config import TrialConfig, TrialResult

if TYPE_CHECKING:
    from autotune.study.one_trial import Policy


@dataclasses.dataclass
class _Clock:
    """A trial's runs on the objective's clock: their training seconds, or under goodput the
    predicted seconds of the samples they have trained (which a busy machine cannot stretch)."""

    predict: Predict | None
    effective: int  # samples an optimizer step
    done: float = 0.0  # the trial's finished runs on the objective's clock
    trained: float = 0.0  # their training seconds
    paused: float = 0.0  # their seconds off the training clock (evaluating)

    def of(self, steps: int, seconds: float) -> float:
        """A run's progress on the objective's clock."""
        return seconds if self.predict is None else self.predict(steps * self.effective)

    def add(self, run: TrialResult) -> None:
        """A finished run."""
        self.done += self.of(run.optimizer_steps or 0, run.train_seconds)
        self.trained += run.train_seconds
        self.paused += run.paused_seconds or 0.0


def train(
    number: int,
    config: dict[str, Any],
    seeds: list[int],
    policy: Policy,
    best: tuple[float, int] | None,
) -> tuple[list[TrialResult], isolation.TrialFailure | isolation.Pruned | None]:
    """Trial `number`'s runs, one per seed it gets, and what stopped them, if anything did."""
    bar = progress.bar(
        f"trial {number}",
        unit="step",
        leave=False,
        announce=False,
        every=progress.LINE_EVERY_SECONDS,
    )
    predict = policy.plan.predict(config) if policy.plan is not None else None
    clock = _Clock(predict, effective=config["batch_size"] * config["accumulation_steps"])
    # The runs the trial's time is the mean of: all replicates under fixed_schedule; under
    # time_to_target one, and more only once its first run beats the best (objective.runs_for).
    planned = policy.objective.first_runs(policy.replicates)

    def on_progress(
        steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        signals.check()
        progress.show_run(bar, steps, total, metric, metric_name=policy.metric_name)
        # Once the planned runs' time passes `planned` times the incumbent's, their mean can only
        # be longer than the incumbent's.
        spent = clock.done + clock.of(steps, seconds)
        if policy.prune and best is not None and spent > best[0] * planned:
            raise _pruned(spent, best, planned=planned, clock=clock, at=(seconds, paused))

    runs: list[TrialResult] = []
    limits = dataclasses.replace(policy.limits, stop_at_target=policy.objective.stops_at_target)
    try:
        with signals.interruptible():
            while len(runs) < planned:
                progress.restart(
                    bar, note=f"seed {len(runs) + 1} of {planned}" if planned > 1 else ""
                )
                runs.append(
                    policy.run_trial(
                        TrialConfig.from_mapping(config),
                        limits=limits,
                        device=policy.device,
                        seed=seeds[len(runs)],
                        progress=on_progress,
                    )
                )
                clock.add(runs[-1])
                if len(runs) == 1:
                    planned = policy.objective.runs_for(
                        runs[0],
                        replicates=policy.replicates,
                        incumbent=None if best is None else best[0],
                        predict=predict,
                    )
    except (isolation.TrialFailure, isolation.Pruned) as failure:
        return runs, failure
    finally:
        bar.close()  # before any message, also when a signal stops the run
    return runs, None


def _pruned(
    spent: float,
    best: tuple[float, int],
    *,
    planned: int,
    clock: _Clock,
    at: tuple[float, float],
) -> isolation.Pruned:
    """What stops a trial whose `planned` runs have `spent` more than `planned` times the best
    time so far, `at` (seconds on the training clock, and off it) into the run on now."""
    runs = f" over {planned} runs" if planned > 1 else ""
    what = "of training" if clock.predict is None else "predicted for the samples trained"
    return isolation.Pruned(
        f"pruned: {spent:.2f} s {what}{runs} passed the best time so far "
        f"({best[0]:.2f} s{' each' if runs else ''}, trial {best[1]}); "
        f"it can no longer win",
        seconds=clock.trained + at[0],
        paused=clock.paused + at[1],
    )
