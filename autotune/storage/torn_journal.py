"""A journal file whose last record was cut short, mended before anything is appended to it.

Optuna's journal appends one line per record. A write that finds the disk full (or a process
killed as it writes) leaves the last line half-written. Optuna reads such a journal, skipping the
torn line; but a record appended after it is glued to the torn half, and that line, no longer the
last, makes every later read fail. So the run, holding the runner lock (no worker writes), cuts the
torn half off first and keeps it in a file beside the journal. A journal glued so by an earlier
version is mended too: a torn half followed by a whole record keeps the record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune import progress
from autotune.errors import StorageError
from autotune.spec.study_file import StudySpec
from autotune.storage import opening

RECORD_START = b'{"op_code"'  # how every record of Optuna's journal begins


def mend(spec: StudySpec, path: Path) -> None:
    """Set aside the torn half-records of the journal at `path`, saying so; a journal with none is
    left untouched (not even opened for writing)."""
    if not path.is_file():
        return
    opening.check_file(spec, create=False)  # the study file, or a file of something else: refused
    path = path.resolve()  # a link to the journal: mend the file, keep the link
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    kept: list[bytes] = []
    torn: list[bytes] = []
    for number, line in enumerate(lines, start=1):
        whole, cut = _split(line)
        if whole is None and not (number == len(lines) and not line.endswith(b"\n")):
            raise StorageError(
                f"{spec.path}: storage: {path} line {number} is no journal record (the file is "
                f"damaged, not only cut short); it is left as it is: restore it from a copy, or "
                f"choose another file with --storage"
            )
        if cut:
            torn.append(cut)
        if whole is not None:
            kept.append(whole)
    if not torn:
        return
    aside = _aside(path)
    good = b"".join(kept)
    try:
        _write_new(aside, b"\n".join(torn) + b"\n")
        if data.startswith(good):  # only the tail was torn: cut it off where it lies
            os.truncate(path, len(good))
        else:
            _replace(path, good)
    except OSError as exc:
        raise StorageError(
            f"{spec.path}: storage: {path} ends in a record cut short, and it cannot be mended "
            f"({exc.strerror}); free some space and run the same command again"
        ) from None
    progress.say(
        f"autotune: {path} held {len(torn)} record(s) cut short (the disk was full, or a run was "
        f"stopped as it wrote); set aside in {aside.name}, and the study goes on from its last "
        f"whole record"
    )


def _split(line: bytes) -> tuple[bytes | None, bytes]:
    """(the whole record the line holds, or None; the torn bytes before it, or b"")."""
    if line.endswith(b"\n") and _is_record(line):
        return line, b""
    if not line.endswith(b"\n"):
        return None, line  # the last line, torn as it was written
    start = line.rfind(RECORD_START)
    while start > 0:  # a torn half with a whole record glued after it
        if _is_record(line[start:]):
            return line[start:], line[:start]
        start = line.rfind(RECORD_START, 0, start)
    return None, line


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _aside(path: Path) -> Path:
    """A new name beside the journal for what is set aside."""
    for n in range(1, 1000):
        candidate = path.with_name(f"{path.name}.torn-{n}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
    raise StorageError(f"{path}: too many .torn-N files beside it; move them away")


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError:
        os.close(fd)
        path.unlink()
        raise
    os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    """`data` written beside `path` and renamed over it: a write cut short leaves the old file."""
    temporary = path.with_name(path.name + ".mending")
    try:
        _write_new(temporary, data)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()
