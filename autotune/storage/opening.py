"""Where a study lives: opening its storage and the files beside it.

Local files (SQLite, Optuna's journal file) are run by one `autotune run` at a time, held by a
lock beside the file (runner_lock.py); a trial found RUNNING there at start-up belongs to a
process that no longer runs. Database servers are shared by many machines, so there Optuna's
heartbeat finds the trials of dead workers instead, and `RetryHeartbeatStaleTrialCallback` queues
them again. What becomes of such trials is recovery.py's; foreign_files.py refuses a file that
holds something else.
"""

from __future__ import annotations

import errno
import os
import socket
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from autotune.errors import StorageError
from autotune.record import schema
from autotune.spec.sections import Target
from autotune.spec.storage_url import local_path
from autotune.spec.study_file import StudySpec, from_mapping
from autotune.storage import faults, foreign_files, runner_lock
from autotune.storage.recovery import MAX_RETRY

# Runs on several machines share a database server's study and may begin it at once: the first
# to store a measurement of the systems is the one every run plans with, so that all train alike.
FIRST_STORED = (
    "autotune: another run of this study stored its {what} first; this run plans with that one"
)


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
    check_file(spec, create=create)
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


def check_file(spec: StudySpec, *, create: bool) -> None:
    """A local storage file that can be opened as a study's: not the study file, a folder, a
    device, missing (unless `create`) or a file of something else."""
    url, path = spec.storage, local_path(spec.storage)
    if path is None:
        return
    if path.exists() and spec.path.exists() and os.path.samefile(path, spec.path):
        raise StorageError(
            f"{spec.path}: storage: {spec.storage} is the study file itself; "
            f"choose another file with --storage or storage:"
        )
    if path.is_dir():
        scheme = url.partition(":///")[0]
        example = path / (spec.name + (".journal" if scheme == "journal" else ".db"))
        raise StorageError(
            f"{spec.path}: storage: {path} is a directory; name a file in it, for example "
            f"--storage {scheme}:///{example}"
        )
    if path.exists() and not path.is_file():
        raise StorageError(
            f"{spec.path}: storage: {path} is not a regular file (a device or a socket, say); "
            f"name a database file with --storage or storage:"
        )
    if not create and not path.is_file():
        # Opening a SQLite URL creates the file; a report must not leave an empty database behind.
        raise StorageError(
            f"{spec.path}: storage: no study database at {path}; "
            f"run `autotune run {spec.path}` first"
        )
    if create:
        check_writable(spec)
    if url.startswith("sqlite:///") and path.is_file():
        foreign_files.refuse_sqlite(spec, path)
    if url.startswith("journal:///") and path.is_file():
        foreign_files.refuse_journal(spec, path)


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
    return any(
        (isinstance(cause, OSError) and cause.errno == errno.ENOSPC)
        or "database or disk is full" in str(cause)
        for cause in faults.causes(exc)
    )


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
            study = optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=sampler,
                direction="minimize",
                load_if_exists=True,
            )
        else:
            study = optuna.load_study(study_name=spec.name, storage=storage, sampler=sampler)
    except KeyError:
        raise StorageError(
            f"{spec.path}: no study named {spec.name!r} in {spec.storage}; "
            f"run `autotune run {spec.path}` first"
        ) from None
    except Exception as exc:
        raise cannot_open(spec, exc) from None
    foreign_files.refuse_foreign_study(spec, study)
    return study


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
            f"{where}: study {name!r} in {url} has no stored definition "
            f"(it was not made by autotune); give its study file instead"
        )
    task, objective = stored["task"], stored.get("objective", {})
    raw = {
        "name": name,
        "task": task if isinstance(task, str) else f"command: {task.get('command')}",
        "target": _as_written(stored["target"]),
        "budget": stored["limits"],
        **(
            {"objective": objective["name"], "replicates": objective["replicates"]}
            if objective
            else {}
        ),
    }
    return from_mapping(raw, path=where, storage=url)


def _as_written(target: dict[str, Any]) -> dict[str, Any]:
    """A stored target as a study file writes it."""
    stored = Target.from_record(target)
    return {"metric": stored.metric, "value": stored.value, "direction": stored.direction}


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
        study = optuna.load_study(study_name=spec.name, storage=storage)
    except KeyError:
        return None
    except Exception as exc:
        raise cannot_open(spec, exc) from None
    foreign_files.refuse_foreign_study(spec, study)
    return study


def worker_id() -> str:
    """Names the process running a trial (user attr `worker`), so it can mark only its own."""
    return f"{socket.gethostname()}:{os.getpid()}"
