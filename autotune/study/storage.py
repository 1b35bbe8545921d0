"""Where a study lives: opening its storage, the files beside it, interrupted trials.

Local files (SQLite, Optuna's journal file) are run by one `autotune run` at a time, held by a
lock beside the file (runner_lock.py); a trial found RUNNING there at start-up belongs to a
process that no longer runs. Database servers are shared by many machines, so there Optuna's heartbeat finds
the trials of dead workers instead, and `RetryHeartbeatStaleTrialCallback` queues them again.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sqlite3
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autotune.errors import StorageError
from autotune.record import schema
from autotune.spec.study_file import StudySpec, from_mapping
from autotune.study import runner_lock


def _heartbeat_setting(text: str) -> tuple[int, int]:
    try:
        interval, grace = (int(part) for part in text.split(","))
    except ValueError:
        interval = grace = 0
    if not 0 < interval < grace:
        raise StorageError(
            f"AUTOTUNE_HEARTBEAT: got {text!r}; two whole numbers of seconds, interval,grace, "
            f"with 0 < interval < grace, e.g. 10,60"
        )
    return interval, grace


# How often a running trial tells a database server it is alive, and the silence after which a
# server's RUNNING trial is taken for dead; set AUTOTUNE_HEARTBEAT=10,60 (seconds) to change them.
HEARTBEAT_SECONDS, GRACE_SECONDS = _heartbeat_setting(os.environ.get("AUTOTUNE_HEARTBEAT", "10,60"))
MAX_RETRY = 1  # an interrupted configuration runs again once; interrupted twice, it is dropped


def local_path(url: str) -> Path | None:
    """The file behind a SQLite or journal URL; None for a database server."""
    for prefix in ("sqlite:///", "journal:///"):
        if url.startswith(prefix):
            return Path(url.removeprefix(prefix))
    return None


def files_of(path: Path) -> dict[Path, str]:
    """A local storage file and the files kept beside it (SQLite's journals, Optuna's journal
    lock, autotune's runner lock), each with what it is."""
    beside = {
        "-journal": "the storage's rollback journal",
        "-wal": "the storage's write-ahead log",
        "-shm": "the storage's shared memory",
        ".lock": "the journal storage's lock",
        runner_lock.SUFFIX: "the study's runner lock",
    }
    return {
        path: "the study's storage",
        **{path.with_name(path.name + suffix): what for suffix, what in beside.items()},
    }


def make_storage(spec: StudySpec, *, create: bool) -> optuna.storages.BaseStorage:
    """Optuna's storage for the spec's URL; with `create=False`, a missing file is an error."""
    url, path = spec.storage, local_path(spec.storage)
    if (
        path is not None
        and path.exists()
        and spec.path.exists()
        and os.path.samefile(path, spec.path)
    ):
        raise StorageError(
            f"{spec.path}: storage: {spec.storage} is the study file itself; "
            f"choose another file with --storage or storage:"
        )
    if path is not None and path.is_dir():
        scheme = url.partition(":///")[0]
        raise StorageError(
            f"{spec.path}: storage: {path} is a directory; name a file in it, for example "
            f"--storage {scheme}:///{path / (spec.name + ('.journal' if scheme == 'journal' else '.db'))}"
        )
    if path is not None and path.exists() and not path.is_file():
        raise StorageError(
            f"{spec.path}: storage: {path} is not a regular file (a device or a socket, say); "
            f"name a database file with --storage or storage:"
        )
    if path is not None and not create and not path.is_file():
        # Opening a SQLite URL creates the file; a report must not leave an empty database behind.
        raise StorageError(
            f"{spec.path}: storage: no study database at {path}; run `autotune run {spec.path}` first"
        )
    if create:
        check_writable(spec)
    if url.startswith("sqlite:///") and path.is_file():
        _refuse_foreign_sqlite(spec, path)
    if url.startswith("journal:///") and path.is_file():
        _refuse_foreign_journal(spec, path)
    try:
        if url.startswith("journal:///"):
            return JournalStorage(JournalFileBackend(str(path)))
        if path is not None:
            return RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                _with_driver(url),
                heartbeat_interval=HEARTBEAT_SECONDS,
                grace_period=GRACE_SECONDS,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(
                    max_retry=MAX_RETRY
                ),
            )
    except Exception as exc:  # SQLAlchemy and driver errors: unreachable, corrupt or not a database
        raise cannot_open(spec, exc) from None


# The tables Optuna's RDB storage creates. A kill while it creates them leaves some: such a file
# is still Optuna's, and opening it again creates the rest.
OPTUNA_TABLES = {
    "alembic_version",
    "studies",
    "study_directions",
    "study_system_attributes",
    "study_user_attributes",
    "trial_heartbeats",
    "trial_intermediate_values",
    "trial_params",
    "trial_system_attributes",
    "trial_user_attributes",
    "trial_values",
    "trials",
    "version_info",
}


def _refuse_foreign_sqlite(spec: StudySpec, path: Path) -> None:
    """An SQLite file with tables, none of them Optuna's, belongs to something else: Optuna would
    add its tables to it. Read-only; a file that is no database is left to Optuna's own error."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as connection:
            tables = {
                row[0]
                for row in connection.execute("select name from sqlite_master where type = 'table'")
            }
    except sqlite3.Error:
        return
    if tables and not tables & OPTUNA_TABLES:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise StorageError(
            f"{spec.path}: storage: {path} is an SQLite database of something else (tables: {shown}), "
            f"not an autotune study; choose another file with --storage or storage:"
        )


def _refuse_foreign_journal(spec: StudySpec, path: Path) -> None:
    """A journal file whose first line is no journal record is something else (or corrupt):
    Optuna would append to it. Read only its first line."""
    with path.open("rb") as file:
        first = file.readline(1 << 20)
    if not first.strip():
        return  # empty: a journal not yet written
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if not (isinstance(record, dict) and "op_code" in record):
        raise StorageError(
            f"{spec.path}: storage: {path} is not an Optuna journal (its first line is no journal "
            f"record), so it is left as it is; choose another file with --storage or storage:"
        )


def cannot_open(spec: StudySpec, exc: BaseException) -> StorageError:
    """The one-line error for a storage that failed to open or be created."""
    if disk_full(exc):
        return StorageError(
            f"{spec.path}: storage: cannot write {spec.storage}: no space left on the device; "
            f"free some space and run the same command again"
        )
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return StorageError(
        f"{spec.path}: storage: cannot open {spec.storage} ({exc.__class__.__name__}: {first_line})"
    )


def disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an error it was raised from, is a write that found the disk full: OSError
    ENOSPC (a journal file), or SQLite's "database or disk is full" under SQLAlchemy and Optuna."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if "database or disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _with_driver(url: str) -> str:
    """A bare postgresql:// names the driver autotune installs (psycopg 3): SQLAlchemy's default
    for it differs between versions (psycopg2 before 2.1)."""
    return (
        "postgresql+psycopg://" + url.removeprefix("postgresql://")
        if url.startswith("postgresql://")
        else url
    )


def open_study(
    spec: StudySpec, *, sampler: optuna.samplers.BaseSampler | None = None, create: bool
) -> optuna.Study:
    """The study in its storage; created on first use when `create`."""
    storage = make_storage(spec, create=create)
    try:
        if create:
            return optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=sampler,
                direction="minimize",
                load_if_exists=True,
            )
        return optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler)
    except KeyError:
        raise StorageError(
            f"{spec.path}: no study named {spec.name!r} in {spec.storage}; run `autotune run {spec.path}` first"
        ) from None
    except Exception as exc:
        raise cannot_open(spec, exc) from None


def spec_of_stored(url: str, name: str) -> StudySpec:
    """The study `name` in the storage at `url`, as the definition it stored when it began says:
    for a report or an export of a study that has no study file (one `autotune.tune()` ran)."""
    where = Path(f"--study {name}")  # what its errors are about
    path = local_path(url)
    if path is not None and not path.is_file():
        raise StorageError(f"{where}: storage: no study database at {path}")
    bare = from_mapping(
        {"name": name, "task": "stored", "target": {"metric": "stored", "value": 1}},
        path=where,
        storage=url,
    )
    opened = make_storage(bare, create=False)
    try:
        stored = schema.definition(optuna.load_study(study_name=name, storage=opened).user_attrs)
    except KeyError:
        names = ", ".join(map(repr, optuna.get_all_study_names(opened))) or "none"
        raise StorageError(f"{where}: no study named {name!r} in {url}; it holds {names}") from None
    except Exception as exc:
        raise cannot_open(bare, exc) from None
    if stored is None:
        raise StorageError(
            f"{where}: study {name!r} in {url} has no stored definition (it was not made by autotune); "
            f"give its study file instead"
        )
    task, objective = stored["task"], stored.get("objective", {})
    raw = {
        "name": name,
        "task": task if isinstance(task, str) else f"command: {task.get('command')}",
        "target": stored["target"],
        "budget": stored["limits"],
        **(
            {"objective": objective["name"], "replicates": objective["replicates"]}
            if objective
            else {}
        ),
    }
    return from_mapping(raw, path=where, storage=url)


def check_writable(spec: StudySpec) -> None:
    """A local storage file (or the folder it is to be made in) this process can write."""
    path = local_path(spec.storage)
    if path is not None and not os.access(path.parent if not path.exists() else path, os.W_OK):
        raise StorageError(
            f"{spec.path}: storage: cannot write {path}; "
            f"choose a writable place with --storage or storage:"
        )


def read_study(spec: StudySpec) -> optuna.Study | None:
    """The stored study, or None when it has not begun; creates and writes nothing."""
    path = local_path(spec.storage)
    if path is not None and not path.exists():
        return None
    storage = make_storage(spec, create=False)
    try:
        return optuna.load_study(study_name=spec.name, storage=storage)
    except KeyError:
        return None
    except Exception as exc:
        raise cannot_open(spec, exc) from None


def worker_id() -> str:
    """Names the process running a trial (user attr `worker`), so it can mark only its own."""
    return f"{socket.gethostname()}:{os.getpid()}"


def mark_interrupted(study: optuna.Study, trial: optuna.trial.FrozenTrial, *, reason: str) -> None:
    """Finish a RUNNING trial as FAIL, marked interrupted, with the reason."""
    storage: Any = (
        study._storage
    )  # Optuna has no public call to finish a trial another process began
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
        if schema.config(trial) is None:
            continue  # stopped while its configuration was being chosen: a fresh trial takes its place
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
    """On a database server: fail the trials of workers whose heartbeat stopped; they are retried."""
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
