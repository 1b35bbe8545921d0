"""Each command run's output kept, so a slow or failing trial can be read afterwards: what the
command wrote to stdout and stderr, one file per run (named by its seed, which no other run of
the study shares) in a folder beside the study's storage, at most MAX_BYTES each."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

MAX_BYTES = 1024 * 1024  # of one run's output kept; the rest is counted, not written


class OutputLog:
    """One run's output file; nothing where it cannot be made (the failure says where it is)."""

    def __init__(self, folder: Path, seed: int) -> None:
        self.path: Path | None = folder / f"run-{seed}.log"
        self.written = self.dropped = 0
        self._fd: int | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # Never through a link, nor over a file with another name: the folder sits beside the
            # study's own files, and a link could make one of them a run's log.
            if folder.is_symlink():
                raise OSError("a link")
            flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o644)
            if os.fstat(fd).st_nlink != 1:
                os.close(fd)
                raise OSError("a hard link")
            os.ftruncate(fd, 0)  # the same seed run again: its last output gives way
            self._fd = fd
        except OSError:
            self.path = None

    def write(self, lines: Iterable[str]) -> None:
        if self._fd is None:
            return
        for line in lines:
            data = (line + "\n").encode(errors="replace")
            if self.written + len(data) > MAX_BYTES:
                self.dropped += len(data)
                continue
            try:
                os.write(self._fd, data)
            except OSError:  # a full disk: the trial goes on without its log
                self.close()
                return
            self.written += len(data)

    def close(self) -> None:
        if self._fd is None:
            return
        if self.dropped:
            note = f"[autotune: {self.dropped:,} more bytes of output not kept]\n"
            try:
                os.write(self._fd, note.encode())
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None

    def where(self) -> str:
        """For a failure's reason: where its output is kept."""
        return f"; its output: {self.path}" if self.path is not None else ""
