"""Ctrl-C and SIGTERM end a run cleanly: the running trial is marked and storage stays whole.

A signal's exception must not land inside a storage write: SQLAlchemy would turn it into a
failed commit and the run would end with a traceback. So, while a run is under way, a signal
raises `Stopped` at once only during training (where nothing is being written); anywhere else it
waits until the next `check()` or `interruptible()` block, which come between storage writes.
SIGTERM (what `kill`, schedulers and container runtimes send) is handled like Ctrl-C.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return 128 + (interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT)


def name(interrupt: KeyboardInterrupt) -> str:
    """SIGTERM, or SIGINT for Ctrl-C."""
    return signal.Signals(interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT).name


class _State:
    interruptible = False  # True while training: a signal may raise right where it lands
    pending: int | None = None  # a signal that arrived during a storage write


def _on_signal(signum: int, _: FrameType | None) -> None:
    if _State.interruptible:
        _State.interruptible = False
        raise Stopped(signum)
    _State.pending = _State.pending or signum


def check() -> None:
    """Raise Stopped for a signal that arrived since the last check."""
    if _State.pending is not None:
        signum, _State.pending = _State.pending, None
        raise Stopped(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A block that writes nothing to storage (training), where a signal stops the run at once."""
    check()
    _State.interruptible = True
    try:
        yield
    finally:
        _State.interruptible = False
    check()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop the run as described above."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in HANDLED}
    _State.pending = None
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
