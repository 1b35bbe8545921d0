"""One trial of a study: ask for a configuration, settle it without training where that is known
(surplus, the OOM boundary), train it (stopped once it can no longer beat the incumbent), tell.

Split from study.py, which runs the loop around it; like study.py it works on the Optuna study.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import torch

from autotune import progress, signals
from autotune.runners import isolation
from autotune.study import objective as objective_, schema, storage
from autotune.search import oom_boundary
from autotune.runners.isolation import RunTrial
from autotune.search.space import Space, suggest
from autotune.train.trial import Limits, TrialConfig


def run_one(study: optuna.Study, *, space: Space, run_trial: RunTrial, device: torch.device, limits: Limits,
            seed: int, metric_name: str, budget: int, asked: list[int], known: list[optuna.trial.FrozenTrial],
            prune: bool = False, objective: str = "time_to_target", replicates: int = 1, alone: bool = False) -> None:
    """Ask for a configuration, train it once per replicate, tell the outcome (objective.py).
    OOM -> PRUNED, other errors -> FAIL; with `prune`, a trial whose training clock passes the best
    time so far (over all its replicates) -> PRUNED. `known`: the study's trials as read just
    before (the incumbent and the OOM boundary); with `alone` (no other worker), also the budget."""
    trial = study.ask()
    asked.append(trial.number)
    with storage.heartbeat(study, trial):  # from ask to tell, as Optuna's own optimize loop does
        _train_and_tell(study, trial, space=space, run_trial=run_trial, device=device, limits=limits, seed=seed,
                        metric_name=metric_name, budget=budget, incumbent=incumbent(known), prune=prune,
                        # this trial included; read before the ask, so other workers' latest may be missing
                        finished=storage.finished_count(known) + 1,
                        ran_out=_ran_out(known), objective=objective, replicates=replicates,
                        current=known if alone else None)


def incumbent(trials: list[optuna.trial.FrozenTrial]) -> tuple[float, int] | None:
    """The best feasible (time to target, trial number) so far, or None."""
    feasible = [(t.value, t.number) for t in trials if schema.is_feasible(t)]
    return min(feasible) if feasible else None


def standing(finished: int, budget: int, best: tuple[float, int] | None) -> str:
    """Where the study stands, e.g. "4/20 finished; best 1.80 s, trial 1"."""
    told = f"{min(finished, budget)}/{budget} finished"
    return f"{told}; best {best[0]:.2f} s, trial {best[1]}" if best else f"{told}; none has reached the target yet"


def _standing_now(study: optuna.Study, budget: int) -> str:
    trials = study.get_trials(deepcopy=False)
    return standing(storage.finished_count(trials), budget, incumbent(trials))


def _ran_out(trials: list[optuna.trial.FrozenTrial]) -> dict[int, dict[str, Any]]:
    """Trial number -> configuration of each trial that really ran out of memory."""
    return {t.number: schema.config(t) for t in trials if schema.ran_out_of_memory(t)}


def _train_and_tell(study: optuna.Study, trial: optuna.Trial, *, space: Space, run_trial: RunTrial,
                    device: torch.device, limits: Limits, seed: int, metric_name: str, budget: int,
                    incumbent: tuple[float, int] | None, finished: int, prune: bool, ran_out: dict[int, dict[str, Any]], objective: str,
                    replicates: int, current: list[optuna.trial.FrozenTrial] | None) -> None:
    def where(best: tuple[float, int] | None) -> str:
        """Where the study stands once this trial is told. Beside other workers, read again: what
        was read before the ask is a whole trial old, and its count and best would be stale."""
        if current is None and progress.mode() == "lines":
            return _standing_now(study, budget)
        return standing(finished, budget, best)

    config = suggest(space, trial)
    trial_seed = seed * 100_000 + trial.number
    schema.begin_trial(trial, worker=storage.worker_id(), config=config, seed=trial_seed)
    # Alone, the read before the ask is current: another read would cost a storage round trip.
    if storage.slots_before(study, trial.number, current) >= budget:
        storage.mark_surplus(study, trial)
        return
    bound = oom_boundary.bound_by(config, ran_out.items())
    if bound is not None:  # it would run out of memory too: the sampler learns that without a run
        reason = oom_boundary.reason(config, bound, ran_out[bound])
        schema.record_oom_bound(trial, reason=reason, bound=bound)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        progress.tell(f"trial {trial.number}: pruned: {reason}", standing=where(incumbent))
        return
    bar = progress.bar(f"trial {trial.number}", unit="step", leave=False, announce=False,
                       every=progress.LINE_EVERY_SECONDS)
    done = 0.0  # training seconds of the trial's finished runs
    # The runs the trial's time is the mean of: all replicates under fixed_schedule; under
    # time_to_target one, and more only once its first run beats the best (objective.runs_for).
    planned = replicates if objective == "fixed_schedule" else 1

    def on_progress(steps: int, total: int, metric: float | None, seconds: float) -> None:
        bar.total = total
        bar.update(steps - bar.n)
        if metric is not None:
            bar.set_postfix_str(f"{metric_name}={metric:.4f}", refresh=False)
        # Once the planned runs' training passes `planned` times the incumbent's time, their mean
        # can only be longer than the incumbent's.
        if prune and incumbent is not None and done + seconds > incumbent[0] * planned:
            runs = f" over {planned} runs" if planned > 1 else ""
            raise isolation.Pruned(f"pruned: {done + seconds:.2f} s of training{runs} passed the best time so far "
                                   f"({incumbent[0]:.2f} s{' each' if runs else ''}, trial {incumbent[1]}); "
                                   f"it can no longer win", seconds=done + seconds)

    failure: isolation.TrialFailure | isolation.Pruned | None = None
    runs = []
    seeds = objective_.seeds(trial_seed, replicates)
    run_limits = dataclasses.replace(limits, stop_at_target=objective == "time_to_target")
    try:
        with signals.interruptible():
            while len(runs) < planned:
                bar.reset()
                runs.append(run_trial(TrialConfig.from_mapping(config), limits=run_limits, device=device,
                                      seed=seeds[len(runs)], progress=on_progress))
                done += runs[-1].train_seconds
                if len(runs) == 1:
                    planned = objective_.runs_for(runs[0], objective=objective, replicates=replicates,
                                                  incumbent=None if incumbent is None else incumbent[0])
    except (isolation.TrialFailure, isolation.Pruned) as exc:
        failure = exc
    finally:
        bar.close()  # before any message, also when a signal stops the run
    if isinstance(failure, isolation.Pruned):
        schema.record_pruned(trial, reason=failure.reason, seconds=failure.seconds)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        progress.tell(f"trial {trial.number}: {failure.reason}", standing=where(incumbent))
        return
    if failure is not None:
        schema.record_failure(trial, reason=failure.reason, oom=failure.oom, diverged=failure.diverged)
        # Out of memory and divergence are the configuration's fault, not the code's: PRUNED, so
        # the sampler learns to avoid them (Optuna's TPE ignores FAILED trials).
        cannot_win = failure.oom or failure.diverged
        study.tell(trial, state=optuna.trial.TrialState.PRUNED if cannot_win else optuna.trial.TrialState.FAIL)
        progress.tell(f"trial {trial.number}: {'pruned' if cannot_win else 'failed'}: {failure.reason}",
                      standing=where(incumbent))
        return
    outcome = objective_.outcome(runs, objective=objective, target=limits.target)
    record = dataclasses.asdict(runs[0])  # the first run in full: its curve, throughput and memory
    record["curve"] = [list(point) for point in runs[0].curve]
    record["final_metric"] = runs[0].final_metric
    if len(runs) > 1:
        record["replicates"] = [objective_.summary(run, run_seed) for run, run_seed in zip(runs, seeds)]
    record["objective_metric"] = outcome.metric
    schema.record_result(trial, record)
    trial.set_constraint("target", outcome.constraint)  # feasible when <= 0
    study.tell(trial, outcome.value)
    feasible = outcome.constraint <= 0
    best = (outcome.value, trial.number) if feasible and (incumbent is None or outcome.value < incumbent[0]) else incumbent
    progress.tell(f"trial {trial.number}: complete in {outcome.value:.2f} s, {metric_name} {outcome.metric:.4f}"
                  f"{'' if feasible else ', short of the target'}{f' (mean of {len(runs)} runs)' if len(runs) > 1 else ''}",
                  standing=where(best), routine=True)
