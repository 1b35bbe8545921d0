"""The training command's process while a trial runs: its process group, polled and stopped once
whatever happens (with any process under it that left the group, descendants.py); how it ended;
and the lines it writes to a pipe, read without blocking.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from autotune.runners.descendants import Descendants

STOP_GRACE_SECONDS = 1.0  # between SIGTERM and SIGKILL: time to flush logs, not to finish training
MAX_LINE_BYTES = 65536  # a longer line (or one without an end) is cut, so memory stays bounded


class Group:
    """The command's process and its process group: polled, and stopped once, whatever happens."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process, self.max_rss, self._stopped = process, 0, False
        self.descendants = Descendants(process.pid)  # those that leave the group (setsid) too

    def poll(self) -> bool:
        """True once the command's process has exited (reaped here, to read its peak memory)."""
        self.descendants.sample()
        if self.process.returncode is None:
            pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
            if pid == 0:
                return False
            self.process.returncode = os.waitstatus_to_exitcode(status)
            self.max_rss = usage.ru_maxrss * 1024  # Linux reports KiB
        return True

    def stop(self) -> int:
        """SIGTERM the group, a grace, then SIGKILL whatever is left of it (workers a script
        leaves behind too) and every process found under the command that left the group;
        returns the command's peak resident memory in bytes."""
        if self._stopped:
            return self.max_rss
        self._stopped = True
        if self.process.returncode is None:
            try:
                self._signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_SECONDS
                while not self.poll() and time.monotonic() < deadline:
                    time.sleep(0.02)
            finally:  # a second Ctrl-C during the grace still leaves nothing behind
                self._signal(signal.SIGKILL)
                if self.process.returncode is None:
                    _, status, usage = os.wait4(self.process.pid, 0)
                    self.process.returncode = os.waitstatus_to_exitcode(status)
                    self.max_rss = usage.ru_maxrss * 1024
        else:
            self._signal(signal.SIGKILL)
        self.descendants.end()
        return self.max_rss

    def _signal(self, signum: int) -> None:
        try:
            # the group's id is the command's pid (a new session)
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):  # the whole group is gone already
            pass


class LineReader:
    """Complete lines from a non-blocking file descriptor; a carriage return also ends a line, so
    that a progress bar's updates do not pile up into one endless line."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd, self._partial, self._lines = fd, b"", []

    def read(self) -> bool:
        """Read what is there; False at end of file (the line in progress then counts as
        complete)."""
        return self._read_some() is not None

    def _read_some(self) -> int | None:
        """Bytes read: 0 when nothing is there now, None at end of file."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return 0
        except OSError:  # closed under us: as good as the end
            chunk = b""
        data = (self._partial + chunk).replace(b"\r", b"\n")
        *complete, self._partial = data.split(b"\n")
        if not chunk:
            complete, self._partial = [*complete, self._partial], b""
        self._partial = self._partial[-MAX_LINE_BYTES:]
        self._lines.extend(line[:MAX_LINE_BYTES] for line in complete if line)
        return len(chunk) or None

    def drain(self) -> None:
        """Read what is there, up to 1 MiB (a process that exited wrote all it will write, though
        a process it left behind may go on writing)."""
        for _ in range(16):
            if not self._read_some():
                return

    def take(self) -> list[str]:
        lines, self._lines = self._lines, []
        return [line.decode(errors="replace") for line in lines]


def exit_status(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = (
            " (from outside the trial: often the kernel's out-of-memory killer)"
            if -code == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"
