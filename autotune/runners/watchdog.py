"""Act when the study's process dies: a trial's child or command must not outlive it as an orphan
that keeps training (and slows whatever runs next)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


def running(pid: int) -> bool:
    """True while `pid` runs (a zombie, killed but not yet waited for, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, not ours to judge
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def on_death(pid: int, action: Callable[[], None], *, every: float) -> None:
    """Call `action` from a daemon thread once `pid` no longer runs, checking every `every` seconds.

    A thread that asks, because the kernel's parent-death signal reaches only a direct child.
    """

    def watch() -> None:
        while running(pid):
            time.sleep(every)
        action()

    threading.Thread(target=watch, name="autotune-watchdog", daemon=True).start()
