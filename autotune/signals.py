"""Ctrl-C and SIGTERM end a run cleanly: the running trial is marked and storage stays whole.

A signal's exception must not land inside a storage write: SQLAlchemy would turn it into a
failed commit and the run would end with a traceback. So, while a run is under way, a signal
raises `Stopped` at once only during training (where nothing is being written); anywhere else it
waits until the next `check()` or `interruptible()` block, which come between storage writes.
SIGTERM (what `kill`, schedulers and container runtimes send) is handled like Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# in a worker of --workers: the pid of the `autotune run` that started it
WORKERS_PARENT = "AUTOTUNE_WORKERS_PARENT"


def exit_code(interrupt: KeyboardInterrupt) -> int:
    return 128 + (interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT)


def by_signal(exc: BaseException) -> bool:
    """Whether `exc` is the user's Ctrl-C or SIGTERM: a Stopped, or any KeyboardInterrupt once a
    signal was taken (user code that caught the Stopped and raised its own). A KeyboardInterrupt
    that user code raised with no signal sent is that code's error, which fails its trial."""
    return isinstance(exc, Stopped) or (isinstance(exc, KeyboardInterrupt) and _State.stopping)


def stopping() -> None:
    """The process is stopping on a signal and has said so: a second Ctrl-C (pressed twice, or
    sent to the whole group again) would only break its exit, a traceback from one of torch's exit
    handlers, so it is ignored from here on. SIGTERM and SIGKILL still end a stuck exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def name(interrupt: KeyboardInterrupt) -> str:
    """SIGTERM, or SIGINT for Ctrl-C."""
    return signal.Signals(
        interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT
    ).name


class _State:
    interruptible = False  # True while training: a signal may raise right where it lands
    pending: int | None = None  # a signal that arrived during a storage write
    # a signal has been taken: the run is stopping, and a second one must not cut its cleanup short
    stopping = False


def _on_signal(signum: int, _: FrameType | None) -> None:
    # One signal stops the run; more (SIGTERM to a process group reaches a `--workers` worker
    # both from the shell and from its parent) must not land inside the writes that mark its
    # trial.
    if _State.stopping:
        return
    _State.stopping = True
    # Pending even when raised: Python drops (prints, then forgets) an exception raised inside a
    # weakref callback or a __del__, which the signal may have landed in. The next check() raises
    # it.
    _State.pending = signum
    if _State.interruptible:
        _State.interruptible = False
        raise Stopped(signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block ends: processes forked inside it (DataLoader
    workers) start with both blocked, and ignore them (train/loader._worker_init). A signal sent
    to the whole process group (Ctrl-C, `timeout`, a scheduler) then stops the run, which shuts
    its workers down in order, instead of killing the workers under it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# How long a loader worker waits, after a SIGTERM, for its parent to shut it down in order before
# it leaves on its own (with status 0, which torch does not report as a failure).
WORKER_GRACE_SECONDS = 10


def _leave_soon(*_: object) -> None:
    signal.alarm(WORKER_GRACE_SECONDS)  # then SIGALRM: os._exit(0)


def ignore_in_worker() -> None:
    """In a forked loader worker: ignore SIGINT, and put SIGTERM off, both its parent's to handle.

    SIGTERM is not simply ignored: multiprocessing ends leftover workers at interpreter exit with
    SIGTERM and then waits for them, so a worker that ignored it would hold that exit up forever.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, lambda *_: os._exit(0))
    signal.signal(signal.SIGTERM, _leave_soon)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    # A stopping parent closes its end of a batch's file-descriptor hand-over mid-way; the
    # worker's multiprocessing resource sharer would print that as a traceback.
    previous = sys.excepthook

    def quiet_when_parent_hangs_up(
        kind: type[BaseException], value: BaseException, trace: TracebackType | None
    ) -> None:
        if not issubclass(kind, (BrokenPipeError, ConnectionResetError)):
            previous(kind, value, trace)

    sys.excepthook = quiet_when_parent_hangs_up


def check() -> None:
    """Raise Stopped for a signal that arrived since the last check (or whose exception was
    dropped).

    Long interruptible blocks call it too, as they report progress."""
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
    except Stopped:
        _State.pending = None  # raised where it landed and on its way out
        raise
    finally:
        _State.interruptible = False
    check()


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """A storage write inside an interruptible block: a signal waits for it to end, then stops
    the run."""
    was, _State.interruptible = _State.interruptible, False
    try:
        yield
    finally:
        _State.interruptible = was
    check()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM stop the run as described above."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _on_signal) for s in HANDLED}
    _State.pending, _State.stopping = None, False
    previous_hook = sys.unraisablehook

    def quiet_when_stopped(unraisable: sys.UnraisableHookArgs) -> None:
        # Python prints an exception it drops as a traceback; a dropped Stopped is still pending.
        if not isinstance(unraisable.exc_value, Stopped):
            previous_hook(unraisable)

    sys.unraisablehook = quiet_when_stopped
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for s, handler in previous.items():
            signal.signal(s, handler)
