"""The run sequence, used by `autotune run`, `autotune.tune` and the benchmarks: check the study
file against the stored study, begin (definition, recovery, systems measurement, one settled
plan), run the trials, confirm the best.

Everything a trial records goes through the schema onto the Optuna trial, so reports are made
from the storage alone. The storage is opened once per process.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna

from autotune import progress, signals
from autotune.errors import AutotuneError, StorageError
from autotune.record import objectives, schema
from autotune.spec.storage_url import local_path
from autotune.spec.study_file import SYSTEMS_ONLY, StudySpec
from autotune.storage import faults, opening, recovery, runner_lock, torn_journal
from autotune.study import one_trial, run_plan, sampler, told_trials, workers
from autotune.study.begin import begin
from autotune.study.budget import finished_count, run_out_unrun, slots_taken, trials_to_train
from autotune.study.confirm import confirm_best
from autotune.study.preparation import Prepared, limits_for, print_notices
from autotune.study.run_plan import RunPlan, as_begun, check_unchanged


def run_sequence(
    spec: StudySpec,
    prepared: Prepared,
    *,
    allow_changes: bool = False,
    run_trials: Callable[[StudySpec], None] | None = None,
) -> optuna.Study:
    """The run, as `autotune run`, `autotune.tune` and the benchmarks all do it: under the signal
    handling and the runner's lock, take the study as it began, check it is unchanged, say the
    notices, run the trials (here, or `run_trials`: the workers of --workers, given the study
    with what is left of its timeout), confirm the best. budget.timeout counts from here: the
    probe spends it too.

    A signal ends it with `signals.Stopped` (a KeyboardInterrupt) once every trial this process
    was running is marked interrupted and queued again; the caller says so and how to go on.
    """
    started = time.monotonic()
    path = local_path(spec.storage)
    try:
        return _run_sequence(spec, prepared, path, started, allow_changes, run_trials)
    except Exception as exc:  # as the lock is let go of, say: its file cannot be written
        raise _as_storage_fault(spec, path, exc) from None


def _run_sequence(
    spec: StudySpec,
    prepared: Prepared,
    path: Path | None,
    started: float,
    allow_changes: bool,
    run_trials: Callable[[StudySpec], None] | None,
) -> optuna.Study:
    with signals.handled(), runner_lock.sole_runner(spec, path) as claim:
        if path is not None and spec.storage.startswith("journal:///"):
            torn_journal.mend(spec, path)  # before any record is appended after a torn one
        stored = opening.read_study(spec)  # read, not written, until the checks have passed
        prepared = as_begun(spec, prepared, stored)
        changes = check_unchanged(spec, prepared, stored, allow_changes=allow_changes)
        print_notices(
            [*prepared.notices, *(f"going on after a change to the study: {c}" for c in changes)]
        )
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # autotune says what happens itself
        if stored is not None:
            opening.check_writable(spec)
        study = stored if stored is not None else opening.open_study(spec, create=True)
        claim.hold_file()  # a new study's file exists from here
        try:
            plan = begin(spec, prepared, study)  # recovery, the definition, before any worker
            left = _time_left(spec, started)
            if run_trials is None or left.budget.timeout == 0:  # none to start: said here, once
                run_study(spec, plan, study, started=started)
            else:
                run_trials(left)
            _say_if_short_of_budget(spec, study, started)
            tell_measured_settings(spec, plan, study)
            confirm_best(spec, plan.prepared, study)
        except Exception as exc:  # while the file is held: one taken away is saved first
            raise _as_storage_fault(spec, path, exc) from None
    return study


def _as_storage_fault(spec: StudySpec, path: Path | None, exc: Exception) -> Exception:
    """`exc` as the StorageFault it stands for, where it is a fault of the storage's files (its
    file taken away: saved beside it first); else `exc` itself, traceback and all."""
    fault = faults.classify(exc)
    if isinstance(exc, StorageError) or fault is None:
        return exc
    try:
        runner_lock.check_storage_file(spec, path)
    except faults.StorageFault as taken:
        return taken
    return faults.StorageFault(spec.path, spec.storage, *(faults.diagnose(path) or fault))


def tell_measured_settings(spec: StudySpec, plan: RunPlan, study: optuna.Study) -> None:
    """systems_only: once the baseline's maths has trained, a trial for every other setting the
    throughput table timed (told_trials.tell_settings). Told here, by the one process
    that then confirms, not by each of --workers: two workers telling at once would each add
    them all."""
    if spec.objective != SYSTEMS_ONLY or plan.goodput is None:
        return
    trained = next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if schema.prediction(t) is not None and "from_trial" not in schema.prediction(t)
        ),
        None,
    )
    if trained is not None:
        told_trials.tell_settings(study, plan.goodput, trained)


def run_study(
    spec: StudySpec,
    plan: RunPlan,
    study: optuna.Study,
    *,
    worker: int | None = None,
    started: float | None = None,
) -> optuna.Study:
    """Run trials until the budget's trials have finished, counting earlier runs and other
    workers', or until its timeout, counted from `started` (time.monotonic(); default: now).
    `worker` is this process's index among `--workers`; None when it runs alone.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    timeout = spec.budget.timeout
    study.sampler = sampler.for_run(
        spec, stored_trials=len(study.get_trials(deepcopy=False)), worker=worker
    )
    budget = trials_to_train(spec, study.get_trials(deepcopy=False))  # systems_only's can grow
    policy = _policy(spec, plan, budget)
    started = time.monotonic() if started is None else started
    mine: list[int] = []  # the trials this process asked for
    here = local_path(spec.storage)
    # In lines mode one_trial prints a line per trial; the bar only announces the study (the
    # parent's, under --workers).
    with progress.bar("study", total=budget, unit="trial", announce=worker is None) as bar:
        try:
            while True:
                signals.check()
                runner_lock.check_storage_file(spec, here)  # deleted or replaced under the run
                recovery.fail_dead_workers(study)
                # One read of the storage per trial: each costs milliseconds, and the tuner's own
                # time per trial is a benchmarked goal (benchmarks/overhead.py).
                trials = study.get_trials(deepcopy=False)
                if (to_train := trials_to_train(spec, trials)) != budget:  # systems_only's retry
                    budget = bar.total = to_train
                    policy = dataclasses.replace(policy, budget=budget)
                _show_progress(bar, trials, budget)
                if _spent(trials, budget) or _timed_out(timeout, started):
                    break
                one_trial.run_one(
                    study,
                    policy,
                    asked=mine,
                    known=trials,
                    # a local file has one runner (sole_runner); a server may have others
                    alone=worker is None and local_path(spec.storage) is not None,
                )
        except KeyboardInterrupt as interrupt:
            # Wherever the signal landed (training, ask, tell), leave none of our trials RUNNING.
            stopped = recovery.mark_running_interrupted(
                study, reason=f"stopped by {signals.name(interrupt)}", only=mine
            )
            recovery.queue_retries(study, only=stopped)
            raise
    return study


def run_as_worker(spec: StudySpec, prepared: object, *, worker: int) -> int:
    """One of `--workers K` (`autotune run --as-worker N`): trials only; the parent recovers,
    confirms and reports. Its exit status."""
    if spec.storage.startswith("sqlite"):
        raise AutotuneError(
            f"{spec.path}: --as-worker is for the processes that --workers starts, "
            f"on a shared storage"
        )
    workers.die_with_parent()
    try:
        with signals.handled(), runner_lock.as_worker(spec, local_path(spec.storage)):
            study = opening.open_study(spec, create=False)  # the parent created it
            plan = run_plan.settle(spec, run_plan.as_begun(spec, prepared, study), study)
            since = time.time() - float(os.environ.get(workers.SPAWNED, time.time()))
            run_study(spec, plan, study, worker=worker, started=time.monotonic() - max(0.0, since))
    except KeyboardInterrupt as interrupt:
        return signals.exit_code(interrupt)
    return 0


def _say_if_short_of_budget(spec: StudySpec, study: optuna.Study, started: float) -> None:
    """Once, by the process the user started (not by each of --workers, each given what was left
    of it), with the timeout the user gave; or where the study ended short of its budget as the
    sampler drew configurations that could not run."""
    trials = study.get_trials(deepcopy=False)
    done, budget = finished_count(trials), trials_to_train(spec, trials)
    if done < budget and _timed_out(spec.budget.timeout, started):
        print(
            f"autotune: timeout of {spec.budget.timeout:g} s reached with {done} of {budget} "
            f"trials finished; run the same command again to go on",
            file=sys.stderr,
        )
    elif done < budget and run_out_unrun(trials, budget):
        unrun = [t for t in trials if schema.is_unrun(t)]
        bound = sum(1 for t in unrun if schema.stored_end(t)["oom_bound"])
        print(
            f"autotune: ended with {done} of {budget} trials run: as many as the budget were "
            f"pruned unrun ({bound} known to run out of memory, as smaller ones had; "
            f"{len(unrun) - bound} with an effective batch larger than the training set): the "
            f"space's micro-batches, accumulation steps or precisions are mostly more than the "
            f"device or the data holds",
            file=sys.stderr,
        )


def _policy(spec: StudySpec, plan: RunPlan, budget: int) -> one_trial.Policy:
    return one_trial.Policy(
        space=plan.space,
        run_trial=plan.prepared.run_trial,
        device=plan.prepared.device,
        limits=limits_for(spec),
        seed=spec.seed,
        metric_name=spec.target.metric,
        budget=budget,
        prune=spec.prune == "incumbent",
        objective=objectives.of(spec.objective),
        replicates=spec.replicates,
        plan=plan.goodput,
        train_samples=plan.prepared.train_samples,
        devices=spec.devices_per_trial,
        probe=plan.probe,
    )


def _spent(trials: list[optuna.trial.FrozenTrial], budget: int) -> bool:
    """Whether the budget's slots are taken. A queued trial (an interrupted one's retry) holds a
    slot, and is the next ask's to run: the budget is spent only once none waits. (Run beyond
    the budget, by a smaller --trials or another worker, it is marked surplus instead.) Trials
    known to run out of memory take no slot, but as many as the budget spend it."""
    waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
    return (slots_taken(trials) >= budget or run_out_unrun(trials, budget)) and not waiting


def _timed_out(timeout: float | None, started: float) -> bool:
    return timeout is not None and time.monotonic() - started >= timeout


def _time_left(spec: StudySpec, started: float) -> StudySpec:
    """`spec` with budget.timeout the seconds of it not yet spent since `started`."""
    timeout = spec.budget.timeout
    if timeout is None:
        return spec
    left = max(0.0, timeout - (time.monotonic() - started))
    return dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, timeout=left))


def _show_progress(bar: progress.Bar, trials: list[optuna.trial.FrozenTrial], budget: int) -> None:
    bar.n = min(finished_count(trials), budget)
    best = one_trial.incumbent(trials)
    if best is not None:
        bar.set_postfix_str(f"best {best[0]:.2f}s (trial {best[1]})", refresh=False)
    bar.refresh()
