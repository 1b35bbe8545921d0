"""One `autotune run` per local storage file, and no worker of a stopped run left behind it.

The lock file beside the storage holds two POSIX record locks: byte 0, held alone by the one
`autotune run` of the study; byte 1, shared by the workers that `--workers` started. A run
started after its predecessor was killed gets byte 0 at once, and then waits for byte 1: the
killed run's workers are still marking their trials and must be gone before their trials are
recovered.

The locks are the kernel's, so they go with the process even after `kill -9`. Record locks
(lockf), not flock: a process forked while one is held (a DataLoader worker, the probe's) does not
inherit it, so a lock goes the moment its process dies, not when the last of its children notices.

A run that ends with no worker left removes the lock file, holding both bytes as it does. Whoever
takes a lock checks afterwards that the file it locked is still the one at the path (and starts
again if not): a lock taken on a file that was removed meanwhile guards nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune import progress, signals
from autotune.errors import StorageError
from autotune.spec.study_file import StudySpec

SUFFIX = ".runner.lock"  # not ".lock": Optuna's journal backend uses that
RUNNER_BYTE, WORKERS_BYTE = 0, 1
WORKERS_GONE_SECONDS = (
    90  # a stopped run's workers get 60 s to mark their trials; then they are killed
)


@contextlib.contextmanager
def sole_runner(spec: StudySpec, path: Path | None) -> Iterator[None]:
    """Hold the lock that makes this process the only runner of the local storage file `path`
    (None: a database server, where none is needed), once no worker of an earlier run is left."""
    if path is None:
        yield
        return

    def refuse(lock: Any) -> None:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        several = (
            "to run several workers on it, give one command --workers K"
            if spec.storage.startswith("journal")
            else "to run several workers, use a journal file or a database server and --workers K"
        )
        raise StorageError(
            f"{spec.path}: storage {path} is being run by {holder}; wait for it to finish "
            f"({several})"
        ) from None

    with _runner_lock(spec, path, RUNNER_BYTE, fcntl.LOCK_EX | fcntl.LOCK_NB, busy=refuse) as lock:
        try:
            _wait_for_earlier_workers(spec, path, lock)
            lock.seek(0)
            lock.truncate()
            lock.write(f"autotune (pid {os.getpid()})\n")
            lock.flush()
            yield
        finally:
            _remove_when_alone(lock)
            fcntl.lockf(lock, fcntl.LOCK_UN, 1, RUNNER_BYTE)


@contextlib.contextmanager
def as_worker(spec: StudySpec, path: Path | None) -> Iterator[None]:
    """Mark this process, for as long as the block runs, as one of the workers of the run that
    holds the local storage file `path` (a database server needs no mark: its heartbeat tells)."""
    if path is None:
        yield
        return
    with _runner_lock(spec, path, WORKERS_BYTE, fcntl.LOCK_SH) as lock:
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN, 1, WORKERS_BYTE)


@contextlib.contextmanager
def _runner_lock(
    spec: StudySpec, path: Path, byte: int, how: int, *, busy: Any = None
) -> Iterator[Any]:
    """The lock file beside `path`, open, with `byte` locked `how`; `busy(lock)` is called where
    a non-blocking lock is held by another process."""
    name = path.with_name(path.name + SUFFIX)
    while True:
        try:
            lock = open(name, "a+")
        except OSError as exc:
            raise StorageError(
                f"{spec.path}: storage: cannot write beside {path} ({exc.strerror}); "
                f"choose a writable place with --storage or storage:"
            ) from None
        with lock:
            try:
                fcntl.lockf(lock, how, 1, byte)
            except OSError:  # EAGAIN or EACCES: held by another process
                busy(lock)
                raise
            if _still_at(lock, name):
                yield lock
                return
            # Removed (and perhaps made anew) by the run that held it, between our open and our
            # lock.


def _still_at(lock: Any, name: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(lock.fileno()), os.stat(name))
    except FileNotFoundError:
        return False


def _remove_when_alone(lock: Any) -> None:
    """Remove the lock file if no worker holds its byte; a worker still running keeps it (the next
    run waits on it)."""
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, WORKERS_BYTE)
    except OSError:
        return
    try:
        os.unlink(lock.name)
    except FileNotFoundError:
        pass
    finally:
        fcntl.lockf(lock, fcntl.LOCK_UN, 1, WORKERS_BYTE)


def _wait_for_earlier_workers(spec: StudySpec, path: Path, lock: Any) -> None:
    """Return once no worker of an earlier run holds the workers' byte: a killed run's workers
    notice within a second and stop, marking their trials."""
    deadline = time.monotonic() + WORKERS_GONE_SECONDS
    said = False
    while True:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, WORKERS_BYTE)
        except OSError:
            pass
        else:
            fcntl.lockf(lock, fcntl.LOCK_UN, 1, WORKERS_BYTE)
            return
        if time.monotonic() > deadline:
            raise StorageError(
                f"{spec.path}: storage {path}: workers of an earlier run of this study are still "
                f"running after {WORKERS_GONE_SECONDS} s; "
                f"stop them (they hold {path.name + SUFFIX}), then run the same command again"
            )
        if not said:
            progress.say(
                "autotune: waiting for the workers of an earlier, stopped run to mark their trials "
                "and exit"
            )
            said = True
        signals.check()
        time.sleep(0.2)
