"""Every process a training command started, found and ended, even one that left its group.

A command runs in a process group of its own, and stopping the group stops what it started; a
process that called setsid() (a daemonising helper, a server a script starts) is in a group of
its own and would outlive the trial. On Linux the processes under the command are listed from
/proc while it runs, and this process is made a child subreaper (prctl) until the trial ends, so
that a descendant whose parent exits is handed here, not to init, and is still found. Each is
ended with the trial.
Elsewhere (no /proc) only the group is stopped, as the reference says (docs/reference.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # from <linux/prctl.h>
SAMPLE_SECONDS = 0.2  # how often the processes under a running command are listed
REAP_SECONDS = 2.0  # how long an ended orphan handed to this process gets to be reaped


def adopt_orphans(adopt: bool = True) -> bool | None:
    """Make this process the one Linux hands a descendant whose parent has exited (or, with
    `adopt` False, no longer); returns whether it was before, None where that is not possible."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            return None
        return (
            bool(was.value)
            if libc.prctl(PR_SET_CHILD_SUBREAPER, int(adopt), 0, 0, 0) == 0
            else None
        )
    except (OSError, AttributeError):
        return None


def _processes() -> dict[int, tuple[int, int]]:
    """Every process: pid -> (parent pid, start time in clock ticks since boot)."""
    found: dict[int, tuple[int, int]] = {}
    try:
        entries = os.scandir("/proc")
    except OSError:
        return found
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            found[int(entry.name)] = (int(fields[1]), int(fields[19]))
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [child for child, (parent, _) in _processes().items() if parent == pid]


class Descendants:
    """The processes under `root` (a command's process), as seen while it runs, and the orphans
    handed to this process since it started."""

    def __init__(self, root: int) -> None:
        self.root, self.seen, self._last = root, {}, 0.0
        # Only while the command runs: other orphans (a process a shell left behind) are no trial's.
        self._adopted_before = adopt_orphans()
        self._adopting = self._adopted_before is not None
        started = _processes().get(root)
        # orphans handed here began no earlier than the command
        self._since = started[1] if started else 0

    def sample(self, *, now: bool = False) -> None:
        """Note the processes under the command; at most every SAMPLE_SECONDS unless `now`."""
        if not now and time.monotonic() - self._last < SAMPLE_SECONDS:
            return
        self._last = time.monotonic()
        table = _processes()
        under = _under(self.root, table)
        here = os.getpid()
        if self._adopting:  # orphans of the command, handed to this process
            under |= {
                pid
                for pid, (parent, start) in table.items()
                if parent == here and pid != self.root and start >= self._since and _not_ours(pid)
            }
        self.seen.update({pid: table[pid][1] for pid in under})

    def end(self) -> list[int]:
        """SIGKILL every process noted (and any under them now) that still runs; returns their
        pids."""
        self.sample(now=True)
        table, ended = _processes(), []
        for pid, start in self.seen.items():
            if pid == self.root or table.get(pid, (0, -1))[1] != start:
                # the command itself (its group is stopped apart), or gone, or its pid reused
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        self._reap(ended)
        if self._adopting and not self._adopted_before:
            adopt_orphans(False)
            self._adopting = False
        return ended

    @staticmethod
    def _reap(pids: list[int]) -> None:
        """Wait for those handed to this process, so that none is left a zombie here."""
        deadline = time.monotonic() + REAP_SECONDS
        waiting = [pid for pid in pids if _processes().get(pid, (0, 0))[0] == os.getpid()]
        while waiting and time.monotonic() < deadline:
            for pid in list(waiting):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    waiting.remove(pid)
            time.sleep(0.01)


def _under(root: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """The processes under `root` in `table` (_processes()), at any depth."""
    under, frontier = set(), {root}
    while frontier:
        frontier = {
            pid for pid, (parent, _) in table.items() if parent in frontier and pid not in under
        }
        under |= frontier
    return under


@contextlib.contextmanager
def ended_after() -> Iterator[None]:
    """Every process started under this one within the block, in its group or not, ended as the
    block ends: for a user's function called here only to look at what it returns (a model
    factory that starts a helper)."""
    adopted_before = adopt_orphans()
    known = _under(os.getpid(), _processes())
    try:
        yield
    finally:
        started = [
            pid for pid in _under(os.getpid(), _processes()) if pid not in known and _not_ours(pid)
        ]
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        Descendants._reap(started)
        if adopted_before is False:
            adopt_orphans(False)


def _not_ours(pid: int) -> bool:
    """A child of this process that it did not start itself through multiprocessing."""
    return pid not in {child.pid for child in multiprocessing.active_children()}
