"""A trial's child process as the system sees it: what it does first (a process group of its own,
Ctrl-C left to the study, an end with the study's process) and how it is ended (killed with what is
left in its group).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from typing import Any

from autotune.runners import descendants, watchdog

WATCH_SECONDS = 0.5  # how often a child checks that the study's process still runs


def become_trial_process(study_pid: int, start_method: str) -> None:
    """What a child of the fork server does first, before it builds the task."""
    # A fork server's child inherits "forkserver" as its start method, and its DataLoader workers
    # would then start through a fork server of their own: each importing torch and unpickling the
    # whole dataset, seconds a trial that the user's own training (the study's start method) never
    # pays. Its workers start as they would in the study's process.
    multiprocessing.set_start_method(start_method, force=True)
    # A process group of its own, which its DataLoader workers join: killing the group at a
    # timeout, or when the study's process is gone, leaves no worker behind with nobody to wait on
    # it.
    os.setpgid(0, 0)
    # A helper the trial detaches (setsid(), a double fork) leaves the group: whose parent exits
    # is handed to this process rather than to init, so it stays under it, where the study finds
    # it and ends it with the trial (`watch`, `end`).
    descendants.adopt_orphans()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    _die_with(study_pid)


def _die_with(study_pid: int) -> None:
    """End this child when the study's process is gone (killed with SIGKILL, say), not orphan it.

    The child's parent is the fork server, which itself waits for its children before it exits,
    so the kernel's parent-death signal would never come; a watchdog thread asks instead.
    """

    watchdog.on_death(
        study_pid, lambda: os.killpg(os.getpid(), signal.SIGKILL), every=WATCH_SECONDS
    )


def watch(child: Any) -> descendants.Descendants:
    """What `end` needs to find every process under a trial's `child` once it has started: the
    ones that left its group too."""
    return descendants.Descendants(child.pid)


def end(child: Any, under: descendants.Descendants | None = None) -> None:
    """Kill a trial's process if it still runs (a timeout, or this process stopped by a signal),
    then what is left of its process group (its DataLoader workers, had it died without shutting
    them down), and with `under` (`watch(child)`) every process under it, in its group or not: a
    helper it detached would outlive the study, holding its output open."""
    if under is not None and child.is_alive():
        under.sample(now=True)  # before the child goes: what is under it, it started
    if child.is_alive():
        _kill_group(child.pid)
        child.kill()  # if it had not yet made its group
    child.join()
    _kill_group(child.pid)
    if under is not None:
        under.end()


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in a trial's process group (the child and its loader workers)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # none left (or the group was never made)
        pass


def exit_description(code: int | None) -> str:
    if code is not None and code < 0:
        return f"the trial's process was killed by {signal.Signals(-code).name}"
    return f"the trial's process exited with status {code} before it reported a result"
