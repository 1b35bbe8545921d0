"""One trial of a study: ask for a configuration, settle it without training where that is known
(surplus, the OOM boundary), train it (stopped once it can no longer beat the incumbent), tell.

run.py runs the loop around it. A trial's runs are one per seed it gets, on the objective's clock.
What every trial of a study shares is one `Policy`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import torch

from autotune import progress, signals
from autotune.probe import chosen_setting
from autotune.probe.plan import GoodputSettings
from autotune.record import derived, objectives, schema, seeds
from autotune.record import runs as stored_runs
from autotune.record.objectives import Predict
from autotune.runners import isolation
from autotune.runners.isolation import RunTrial
from autotune.search import oom_boundary
from autotune.search.space import Space, suggest
from autotune.spec.study_file import TIME_TO_TARGET
from autotune.storage import opening, recovery
from autotune.study import told_trials, workers
from autotune.study.budget import finished_count, mark_surplus, slots_before
from autotune.train.config import Limits, TrialConfig, TrialResult
from autotune.train.measure import other_load


@dataclasses.dataclass(frozen=True)
class Policy:
    """What every trial of a study shares: how its runs train and the study's rules for them."""

    space: Space
    run_trial: RunTrial
    device: torch.device
    limits: Limits
    seed: int
    metric_name: str
    budget: int
    prune: bool = False  # stop a trial once its training passes the incumbent's time
    objective: objectives.Objective = objectives.OBJECTIVES[TIME_TO_TARGET]
    replicates: int = 1
    # goodput: how a trial's maths trains, and its time from its samples
    plan: GoodputSettings | None = None
    # the task's training set, where autotune trains it: no effective batch may exceed it
    train_samples: int | None = None
    devices: int = 1  # a trial's processes, one micro-batch each per forward pass
    # the joint probe's outcome, where trials train at its setting: once one reaches the target,
    # the setting soonest over its run (chosen_setting.for_run)
    probe: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Before:
    """The study as read just before the ask: the incumbent, the count with this trial, the
    configurations that ran out of memory; `current` when that read is known to be current."""

    incumbent: tuple[float, int] | None
    finished: int
    ran_out: dict[int, dict[str, Any]]
    current: list[optuna.trial.FrozenTrial] | None


def run_one(
    study: optuna.Study,
    policy: Policy,
    *,
    asked: list[int],
    known: list[optuna.trial.FrozenTrial],
    alone: bool = False,
) -> None:
    """Ask for a configuration, train it once per replicate, tell the outcome (objective.py).
    OOM -> PRUNED, other errors -> FAIL; with `policy.prune`, a trial whose training clock passes
    the best time so far (over all its replicates) -> PRUNED. `known`: the study's trials as read
    just before (the incumbent and the OOM boundary); with `alone` (no other worker), also the
    budget."""
    trial = study.ask()
    asked.append(trial.number)
    # this trial included; read before the ask, so other workers' latest may be missing
    before = Before(
        incumbent(known),
        finished_count(known) + 1,
        _ran_out(known),
        known if alone else None,
    )
    with recovery.heartbeat(study, trial):  # from ask to tell, as Optuna's own optimize loop does
        sampled = suggest(policy.space, trial)  # stored by Optuna as the trial's params
        trained = _to_train(trial, sampled, policy, known, before.incumbent)
        trial_seed = seeds.for_trial(policy.seed, trial.number, paired=policy.objective.paired)
        schema.begin_trial(
            trial,
            worker=opening.worker_id(),
            trained=trained or sampled,
            seed=trial_seed,
            devices=workers.assigned_gpus(),
        )
        if _settled_unrun(study, trial, trained or sampled, policy, before):
            return
        if trained is None:
            failure = isolation.TrialFailure(
                "out of memory: no systems setting in the probe's table trains this "
                "configuration's maths (each ran out of memory, or was not timed)",
                oom=True,
            )
            _tell_failure(study, trial, failure, policy, before)
            return
        run_seeds = seeds.replicates(trial_seed, policy.replicates)
        with other_load() as load:  # how busy the machine was: the report says where it moved
            runs, failure = train_runs(trial.number, trained, run_seeds, policy, before.incumbent)
        schema.record_other_load(trial, load.record())
        if failure is not None:
            _tell_failure(study, trial, failure, policy, before)
        else:
            _tell_outcome(study, trial, list(zip(runs, run_seeds)), policy, before)


def _to_train(
    trial: optuna.Trial,
    sampled: dict[str, Any],
    policy: Policy,
    known: list[optuna.trial.FrozenTrial],
    best: tuple[float, int] | None,
) -> dict[str, Any] | None:
    """The configuration a trial trains for the one sampled: the one place it is rewritten. With
    the probe's outcome, a run that stops at the target takes the setting soonest over the samples
    it is expected to train (about the incumbent's; the baseline's queued trial keeps its own);
    under goodput, the fastest setting for its maths (None where none fits)."""
    config = sampled
    if policy.probe is not None and policy.objective.stops_at_target:
        if not schema.is_baseline(trial):
            samples = _samples_to_target(known, best)
            config = chosen_setting.for_run(policy.probe, policy.space, config, samples)
    return config if policy.plan is None else policy.plan.to_train(config)


def incumbent(trials: list[optuna.trial.FrozenTrial]) -> tuple[float, int] | None:
    """The best feasible (time to target, trial number) so far, or None."""
    feasible = [(t.value, t.number) for t in trials if derived.is_feasible(t)]
    return min(feasible) if feasible else None


def _samples_to_target(
    trials: list[optuna.trial.FrozenTrial], best: tuple[float, int] | None
) -> float | None:
    """The samples the incumbent (`best`: its time and number) needed to reach the target (its
    first run's: with replicates, an estimate of the run length like any other)."""
    if best is None:
        return None
    trial = next((t for t in trials if t.number == best[1]), None)
    return schema.measured(trial).get("samples_to_target") if trial is not None else None


def standing(finished: int, budget: int, best: tuple[float, int] | None) -> str:
    """Where the study stands, e.g. "4/20 finished; best 1.80 s, trial 1"."""
    told = f"{min(finished, budget)}/{budget} finished"
    return (
        f"{told}; best {best[0]:.2f} s, trial {best[1]}"
        if best
        else f"{told}; none has reached the target yet"
    )


def _standing_now(study: optuna.Study, budget: int) -> str:
    trials = study.get_trials(deepcopy=False)
    return standing(finished_count(trials), budget, incumbent(trials))


def _ran_out(trials: list[optuna.trial.FrozenTrial]) -> dict[int, dict[str, Any]]:
    """Trial number -> configuration of each trial that really ran out of memory, and that no
    later trial needing at least its memory has trained through."""
    ran_out = {t.number: schema.trained_config(t) for t in trials if schema.ran_out_of_memory(t)}
    trained = {
        t.number: schema.trained_config(t)
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE
    }
    for number in oom_boundary.contradicted(ran_out, trained):
        del ran_out[number]
    return ran_out


def _where(
    study: optuna.Study, policy: Policy, before: Before, best: tuple[float, int] | None
) -> str:
    """Where the study stands once this trial is told. Beside other workers, read again: what
    was read before the ask is a whole trial old, and its count and best would be stale."""
    if before.current is None and progress.mode() == "lines":
        return _standing_now(study, policy.budget)
    return standing(before.finished, policy.budget, best)


def _settled_unrun(
    study: optuna.Study, trial: optuna.Trial, config: dict[str, Any], policy: Policy, before: Before
) -> bool:
    """End the trial without training where its end is known: surplus, an effective batch larger
    than the training set, or past the OOM boundary."""
    # Alone, the read before the ask is current: another read would cost a storage round trip.
    if slots_before(study, trial.number, before.current) >= policy.budget:
        mark_surplus(study, trial)
        return True
    effective, bound = config["batch_size"] * config["accumulation_steps"] * policy.devices, None
    if policy.train_samples is not None and effective > policy.train_samples:
        # batch_size and accumulation_steps are drawn apart: a pair of them can ask for more than
        # one epoch a step
        devices = f" x {policy.devices} devices" if policy.devices > 1 else ""
        reason = (
            f"pruned: an effective batch of {effective} "
            f"({config['batch_size']} x {config['accumulation_steps']}{devices}) "
            f"is larger than the {policy.train_samples} training samples; "
            f"it cannot take one optimizer step an epoch"
        )
    else:
        bound = oom_boundary.bound_by(config, before.ran_out.items())
        if bound is None:
            return False
        # it would run out of memory too: the sampler learns that without a run
        reason = oom_boundary.not_run_reason(config, bound, before.ran_out[bound])
    schema.record_unrun(trial, reason=reason, bound=bound)
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    unrun = dataclasses.replace(before, finished=before.finished - 1)  # it takes no slot
    progress.tell(
        f"{derived.trial_label(trial)}: {reason if bound is None else f'pruned: {reason}'}",
        standing=_where(study, policy, unrun, before.incumbent),
    )
    return True


def _tell_failure(
    study: optuna.Study,
    trial: optuna.Trial,
    failure: isolation.TrialFailure | isolation.Pruned,
    policy: Policy,
    before: Before,
) -> None:
    if isinstance(failure, isolation.Pruned):
        schema.record_pruned(
            trial, reason=failure.reason, seconds=failure.seconds, paused=failure.paused
        )
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        progress.tell(
            f"{derived.trial_label(trial)}: {failure.reason}",
            standing=_where(study, policy, before, before.incumbent),
        )
        return
    schema.record_failure(trial, reason=failure.reason, oom=failure.oom, diverged=failure.diverged)
    # Out of memory and divergence are the configuration's fault, not the code's: PRUNED, so
    # the sampler learns to avoid them (Optuna's TPE ignores FAILED trials).
    cannot_win = failure.oom or failure.diverged
    study.tell(
        trial, state=optuna.trial.TrialState.PRUNED if cannot_win else optuna.trial.TrialState.FAIL
    )
    progress.tell(
        f"{derived.trial_label(trial)}: {'pruned' if cannot_win else 'failed'}: {failure.reason}",
        standing=_where(study, policy, before, before.incumbent),
    )


def _tell_outcome(
    study: optuna.Study,
    trial: optuna.Trial,
    runs: list[tuple[TrialResult, int]],
    policy: Policy,
    before: Before,
) -> None:
    """Record the runs (the first in full: its curve, throughput and memory) and tell the trial's
    time."""
    first = runs[0][0]
    config = schema.trained_config(trial)
    predict = policy.plan.predict(config) if policy.plan is not None else None
    outcome = objectives.outcome(
        [run for run, _ in runs],
        policy.objective,
        target=policy.limits.target,
        predict=predict,
        minimize=policy.limits.minimize,
    )
    record = stored_runs.full(first)
    if len(runs) > 1:
        record["replicates"] = [stored_runs.replicate(run, seed) for run, seed in runs]
    record["objective_metric"] = outcome.metric
    if policy.plan is not None and outcome.constraint <= 0:
        # Named by the setting that trains its samples soonest (the one the prediction is of).
        samples = sum(run.samples_to_target for run, _ in runs) / len(runs)
        best_config, speed = policy.plan.best(config, samples)
        record[schema.PREDICTION] = told_trials.prediction_record(
            speed, samples=samples, seconds=outcome.value, trained=config
        )
        schema.record_trained_config(trial, best_config)
    schema.record_result(trial, record)
    trial.set_constraint("target", outcome.constraint)  # feasible when <= 0
    study.tell(trial, outcome.value)
    feasible = outcome.constraint <= 0
    best = before.incumbent
    if feasible and (best is None or outcome.value < best[0]):
        best = (outcome.value, trial.number)
    timed = "predicted" if policy.plan is not None and feasible else "complete in"
    short = "" if feasible else ", short of the target"
    mean = f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
    progress.tell(
        f"{derived.trial_label(trial)}: {timed} {outcome.value:.2f} s, "
        f"{policy.metric_name} {outcome.metric:.4f}{short}{mean}",
        standing=_where(study, policy, before, best),
        routine=True,
    )


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


def train_runs(
    number: int,
    config: dict[str, Any],
    run_seeds: list[int],
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
                        seed=run_seeds[len(runs)],
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
