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
again if not): a lock taken on a file that was removed meanwhile guards nothing. The lock file is
opened without following a symbolic link and must be a plain file with one name, holding nothing
but what autotune writes: a lock file that is a link to another file would overwrite that file.

The lock file is named after the storage's real path, so a symbolic link to the storage or another
spelling of its URL finds the same lock. A hard link cannot be told by name: the runner also holds
a lock on the storage file itself, by its identity (an open-file-description lock, far past any
byte SQLite locks), from the moment the file exists. Record locks are the process's, so a second
run inside one process (another thread, or `tune()` called from a trial) is refused by a table of
the storages this process runs, before any lock file is touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune import progress, signals
from autotune.errors import StorageError
from autotune.spec.study_file import StudySpec
from autotune.storage import faults

SUFFIX = ".runner.lock"  # not ".lock": Optuna's journal backend uses that
RUNNER_BYTE, WORKERS_BYTE = 0, 1
WORKERS_GONE_SECONDS = (
    90  # a stopped run's workers get 60 s to mark their trials; then they are killed
)
HOLDER = re.compile(r"autotune \(pid \d+\)\n?")  # all a lock file of autotune's ever holds
# The byte of the storage file locked by identity: far past the bytes SQLite locks (from 1 GiB).
IDENTITY_BYTE = 1 << 62

_running: set[str] = set()  # the storages this process is running (the key of `_key`)
_running_guard = threading.Lock()
_held_files: dict[str, int] = {}  # storage key -> descriptor whose lock holds the file's identity


def _close_held_in_child() -> None:
    """A forked child (a DataLoader worker) must not keep the storage's identity lock alive after
    the run that took it has died: it closes its copies of the descriptors."""
    for fd in _held_files.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_files.clear()
    _running.clear()


os.register_at_fork(after_in_child=_close_held_in_child)


class Claim:
    """The run's hold on its storage: `hold_file()` once the storage file exists (it may be made
    only after the lock is taken)."""

    def __init__(self, spec: StudySpec, path: Path | None, key: str) -> None:
        self._spec, self._path, self._key = spec, path, key

    def hold_file(self) -> None:
        if self._path is not None:
            _hold_identity(self._spec, self._path, self._key)


@contextlib.contextmanager
def sole_runner(spec: StudySpec, path: Path | None) -> Iterator[Claim]:
    """Hold the lock that makes this process the only runner of the local storage file `path`
    (None: a database server, where other machines may run it too), once no worker of an earlier
    run is left; and refuse a second run of the same storage inside this process."""
    key = _key(spec, path)
    with _running_here(spec, key):
        if path is None:
            yield Claim(spec, None, key)
            return
        with _sole_runner_of_file(spec, path, key) as claim:
            yield claim


def _key(spec: StudySpec, path: Path | None) -> str:
    """What names a storage within this process: a file's real path, a server's study."""
    if path is None:
        return f"{spec.storage.partition('?')[0]}#{spec.name}"
    return str(_real(path))


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a link loop: the open that follows reports it
        return path.absolute()


@contextlib.contextmanager
def _running_here(spec: StudySpec, key: str) -> Iterator[None]:
    with _running_guard:
        if key in _running:
            raise StorageError(
                f"{spec.path}: storage {spec.storage} is being run by this process already "
                f"(another thread, or autotune.tune() called from inside a trial); "
                f"wait for that run to finish"
            )
        _running.add(key)
    try:
        yield
    finally:
        with _running_guard:
            _running.discard(key)


@contextlib.contextmanager
def _sole_runner_of_file(spec: StudySpec, path: Path, key: str) -> Iterator[Claim]:
    """The lock beside the file, and the file's own where it exists."""

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
        claim = Claim(spec, path, key)
        try:
            if path.exists():
                claim.hold_file()
            _wait_for_earlier_workers(spec, path, lock)
            lock.seek(0)
            lock.truncate()
            lock.write(f"autotune (pid {os.getpid()})\n")
            lock.flush()
            yield claim
        finally:
            _let_go_of_identity(key)
            _remove_when_alone(lock, lock_path(path))
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
    name = lock_path(path)
    while True:
        lock = _open_lock(spec, path, name)
        with lock:
            try:
                fcntl.lockf(lock, how, 1, byte)
            except OSError:  # EAGAIN or EACCES: held by another process
                busy(lock)
                raise
            if _still_at(lock, name):
                _check_is_a_lock(spec, lock, name)
                yield lock
                return
            # Removed (and perhaps made anew) by the run that held it, between our open and our
            # lock.


def lock_path(path: Path) -> Path:
    """The runner lock of the storage file `path`: beside its real path, whatever link or
    spelling named it."""
    real = _real(path)
    return real.with_name(real.name + SUFFIX)


def _open_lock(spec: StudySpec, path: Path, name: Path) -> Any:
    """The lock file at `name`, made if missing; never through a symbolic link, and never a file
    that is something else (a FIFO, a device, a hard link to another file)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StorageError(
                f"{spec.path}: storage: {name} is a symbolic link, not the runner lock autotune "
                f"keeps beside {path}; it is left as it is: remove the link, then run again"
            ) from None
        raise StorageError(
            f"{spec.path}: storage: cannot write beside {path} ({exc.strerror}); "
            f"choose a writable place with --storage or storage:"
        ) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "has other names (hard links)" if stat.S_ISREG(info.st_mode) else "is no plain file"
        raise StorageError(
            f"{spec.path}: storage: {name} {what}, not the runner lock autotune keeps beside "
            f"{path}; it is left as it is: remove it, then run again"
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+")


def _check_is_a_lock(spec: StudySpec, lock: Any, name: Path) -> None:
    """A lock file holds one line of autotune's or nothing; anything else is a file of somebody
    else's under the lock's name, which the run would overwrite."""
    lock.seek(0)
    held = lock.read(256)
    if held and not HOLDER.fullmatch(held):
        raise StorageError(
            f"{spec.path}: storage: {name} holds something other than autotune's runner lock; "
            f"it is left as it is: move it away, then run again"
        )


def _hold_identity(spec: StudySpec, path: Path, key: str) -> None:
    """Lock the storage file itself, by its identity (device and inode): a run reaching it under
    another name (a hard link) is refused. Kept until `_let_go_of_identity(key)`."""
    if key in _held_files or not hasattr(fcntl, "F_OFD_SETLK"):
        return  # held already; or no open-file-description locks here (not Linux)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return  # not writable or not a file: the storage checks say so in their own words
    # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for an open file description's)
    request = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, IDENTITY_BYTE, 1, 0)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            return  # a file system without such locks: the lock by name is all there is
        raise StorageError(
            f"{spec.path}: storage {path} is being run by another autotune process under "
            f"another name (a hard link or another path to the same file); wait for it to finish"
        ) from None
    _held_files[key] = fd


def check_storage_file(spec: StudySpec, path: Path | None) -> None:
    """Raise StorageFault where the storage file `path` (the storage URL's local_path) that this
    process holds was deleted or replaced since it took it, once the study as it was (the file
    still held open) is written out beside it."""
    held = _held_files.get(_key(spec, path)) if path is not None else None
    if held is None or not faults.file_taken(path, held):
        return
    raise faults.StorageFault(
        spec.path,
        spec.storage,
        "its file was deleted or replaced while the study ran",
        "Put it back",
        rescued=faults.rescue(path, held),
        path=path,
    )


def _let_go_of_identity(key: str) -> None:
    fd = _held_files.pop(key, None)
    if fd is not None:
        os.close(fd)


def _still_at(lock: Any, name: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(lock.fileno()), os.stat(name))
    except FileNotFoundError:
        return False


def _remove_when_alone(lock: Any, name: Path) -> None:
    """Remove the lock file if no worker holds its byte; a worker still running keeps it (the next
    run waits on it)."""
    try:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, WORKERS_BYTE)
    except OSError:
        return
    try:
        os.unlink(name)
    except OSError:  # gone already; or its folder can no longer be written: left, which is safe
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
