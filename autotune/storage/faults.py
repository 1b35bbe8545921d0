"""A storage that fails while a study runs: what went wrong, said in one line, and the study's
file kept where it was taken away.

The faults are the machine's or the user's, not autotune's: a full disk, a file size limit
(`ulimit -f`), a file system made read-only, a database file deleted or replaced under the run.
SQLite rolls a failed write back and a journal's torn record is mended by the next run, so every
trial finished before stays stored; where the file itself was deleted or replaced, the copy this
process still holds open is written out beside it first.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from pathlib import Path

from autotune.errors import StorageError

# what a file needs free below it to take another write, and the room left on the disk that says
# it is full: a trial's records are a few kilobytes
HEADROOM_BYTES = 64 << 10
# errno of an OSError from a storage's file -> what it means, and what the user does about it
FILE_FAULTS = {
    errno.ENOSPC: ("no space left on the device", "Free some space"),
    errno.EDQUOT: ("the disk quota is used up", "Free some space"),
    errno.EFBIG: ("a file grew past the size limit (ulimit -f)", "Raise the limit"),
    errno.EROFS: ("its file system is read-only", "Make it writable"),
    errno.EACCES: ("permission denied", "Make its folder writable"),
    errno.EPERM: ("permission denied", "Make its folder writable"),
    errno.EIO: ("an input/output error", "Check the disk"),
}
# SQLite's messages (under SQLAlchemy and Optuna) -> the same
SQLITE_FAULTS = {
    "database or disk is full": ("no space left on the device", "Free some space"),
    "attempt to write a readonly database": (
        "its database can no longer be written (deleted, replaced or made read-only)",
        "Make it and its folder writable (or put it back)",
    ),
    "disk I/O error": (
        "a disk input/output error (a full disk, a file size limit, or a fault)",
        "Check the disk",
    ),
    "file is not a database": ("its database was replaced by another file", "Put it back"),
    "no such table": ("its database was replaced by another file", "Put it back"),
    "database disk image is malformed": ("its database is damaged", "Check the disk"),
    "unable to open database file": ("its database can no longer be opened", "Put it back"),
}


class StorageFault(StorageError):
    """The storage failed while the study ran: `what`, what to do (`remedy`), and where this
    process saved the study (`rescued`) where its file at `path` was taken away."""

    def __init__(
        self,
        spec_path: object,
        storage: str,
        what: str,
        remedy: str,
        *,
        rescued: Path | None = None,
        path: Path | None = None,
    ) -> None:
        self.spec_path, self.storage, self.what, self.remedy = spec_path, storage, what, remedy
        self.rescued, self.path = rescued, path
        super().__init__(self.line("run the same command again"))

    def line(self, resume: str) -> str:
        """The one line that says it, ending with `resume`: the command that goes on."""
        where = f"{self.spec_path}: storage {self.storage}: {self.what}"
        if self.rescued is not None:
            return (
                f"{where}; the study as it was, every trial finished before, is saved in "
                f"{self.rescued}: move it to {self.path}, then resume with: {resume}"
            )
        return (
            f"{where}; every trial finished before is saved. "
            f"{self.remedy}, then resume with: {resume}"
        )


def classify(exc: BaseException | None) -> tuple[str, str] | None:
    """(what went wrong, the remedy) where `exc`, or an error it was raised from, is a fault of
    the storage's files; None where it is not (a bug, which keeps its traceback)."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in FILE_FAULTS:
            what, remedy = FILE_FAULTS[cause.errno]
            return (f"{what} ({cause.filename})" if cause.filename else what), remedy
        text = str(cause)
        for message, fault in SQLITE_FAULTS.items():
            if message in text:
                return fault
    return None


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and each error it was raised from (or while handling), once each."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def diagnose(path: Path | None) -> tuple[str, str] | None:
    """What is wrong with the storage file `path` and its folder as this process finds them now,
    where SQLite's word for it ("disk I/O error", "readonly database") covers several causes;
    None where nothing is."""
    if path is None:
        return None
    if not os.access(path.parent, os.W_OK):
        return f"its folder {path.parent} can no longer be written", "Make it writable"
    if path.exists() and not os.access(path, os.W_OK):
        return "its file can no longer be written", "Make it writable"
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if (
        limit != resource.RLIM_INFINITY
        and path.exists()
        and path.stat().st_size + HEADROOM_BYTES > limit
    ):
        return FILE_FAULTS[errno.EFBIG]
    try:
        space = os.statvfs(path.parent)
    except OSError:
        return None
    if space.f_bavail * space.f_frsize < HEADROOM_BYTES:
        return FILE_FAULTS[errno.ENOSPC]
    return None


def file_taken(path: Path, held: int) -> bool:
    """Whether the storage file this process holds open (`held`, a descriptor) is no longer the one
    at `path`: deleted, or replaced by another."""
    try:
        return not os.path.samestat(os.fstat(held), os.stat(path))
    except FileNotFoundError:
        return True


def rescue(path: Path, held: int) -> Path:
    """Write the file this process holds open (the study as it was) beside `path`, under a name
    nothing else uses, and return that name."""
    for n in range(1, 1000):
        copy = path.with_name(f"{path.name}.rescued-{n}")
        try:
            out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with open(out, "wb") as target:
            offset = 0
            while chunk := os.pread(held, 1 << 20, offset):
                target.write(chunk)
                offset += len(chunk)
            target.flush()
            os.fsync(target.fileno())
        return copy
    raise FileExistsError(f"{path.name}.rescued-1 to -999 all exist")
