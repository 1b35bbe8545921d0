"""Trials a stopped process left RUNNING, and their retries.

On a local file the run that starts next marks them interrupted and queues each configuration
again, once. On a database server each running trial's heartbeat tells the server its worker is
alive; a trial whose heartbeat stopped is failed and retried (opening.make_storage sets that up).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.record import schema

MAX_RETRY = 1  # an interrupted configuration runs again once; interrupted twice, it is dropped


def mark_interrupted(study: optuna.Study, trial: optuna.trial.FrozenTrial, *, reason: str) -> None:
    """Finish a RUNNING trial as FAIL, marked interrupted, with the reason."""
    # Optuna has no public call to finish a trial another process began
    storage: Any = study._storage
    try:
        schema.record_interrupted(storage, trial._trial_id, reason=reason)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        pass  # it finished after all, between our read and our write


def mark_running_interrupted(
    study: optuna.Study, *, reason: str, only: list[int] | None = None
) -> list[int]:
    """Mark RUNNING trials interrupted: all of them (a local file held by this runner, where none
    can belong to a live process), or `only` those numbered (this worker's own)."""
    running = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if only is None or t.number in only
    ]
    for trial in running:
        mark_interrupted(study, trial, reason=reason)
    return [t.number for t in running]


def queue_retries(study: optuna.Study, *, only: list[int] | None = None) -> list[int]:
    """Queue each interrupted configuration to run again, once; safe to repeat after any kill.

    Written as Optuna's RetryHeartbeatStaleTrialCallback(max_retry=1) writes its retries (system
    attrs `failed_trial`, `retry_history`), so both kinds of retry read alike; unlike it, the
    interrupted trial's own user attrs (its reason) are not copied onto the retry, but for the
    marks of the baseline and the prior.
    """
    trials = study.get_trials(deepcopy=False)
    retried = {schema.retried_from(t) for t in trials}
    queued = []
    for trial in trials:
        retry = schema.retry_attrs(trial)
        if only is not None and trial.number not in only:
            continue  # another worker's trial: that worker, or the heartbeat, retries it
        if (
            not schema.is_interrupted(trial)
            or trial.number in retried
            or len(retry[schema.RETRY_HISTORY]) > MAX_RETRY
        ):
            continue
        if schema.trained_config(trial) is None:
            # stopped while its configuration was being chosen: a fresh trial takes its place
            continue
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.WAITING,
                params=trial.params,
                distributions=trial.distributions,
                system_attrs=retry,
                user_attrs=schema.queue_marks(trial),
            )
        )
        queued.append(trial.number)
    return queued


def fail_dead_workers(study: optuna.Study) -> None:
    """On a database server: fail the trials of workers whose heartbeat stopped; they are
    retried."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.trial.Trial) -> Iterator[None]:
    """While a trial runs, tell a database server that its worker is alive (Optuna's heartbeat)."""
    storage: Any = study._storage
    interval = (
        storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
    )
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            storage.record_heartbeat(trial._trial_id)
            stop.wait(interval)

    thread = threading.Thread(target=beat, daemon=True, name=f"heartbeat-{trial.number}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
