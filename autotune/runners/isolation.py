"""Where a trial runs: in this process, or in a fresh child process of its own.

In a child, a trial that hangs is killed at its wall-clock limit ("timeout"), one that dies
(segfault, `os._exit`, a killed process) is recorded as "crashed", and everything it allocated,
GPU memory and the CUDA context included, goes back to the system when it exits. Children come
from a fork server that has imported torch once, so a trial does not pay torch's import again.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from autotune import signals
from autotune.runners import reasons, trial_process
from autotune.train import oom
from autotune.train.config import Diverged, Limits, Progress, TrialConfig, TrialResult
from autotune.train.tasks import BUILT_IN, Task, load_task
from autotune.train.trial import run

T = TypeVar("T")
PROGRESS_SECONDS = 0.25  # how often a child reports its progress
# Imported by torch on first use, not with torch: the first optimizer built imports torch._dynamo,
# 1.9 s here, which would otherwise land on the first trial's training clock (in every trial, in
# a child process). Imported before any clock starts: in this process, and in the fork server.
LAZY_IMPORTS = ("torch._dynamo",)
EXIT_GRACE_SECONDS = 30  # a child that sent its result gets this long to exit before it is killed


class TrialFailure(Exception):
    """A trial that ended without a result: OOM, divergence, an error, a timeout or a crash, with
    the reason."""

    def __init__(self, reason: str, *, oom: bool = False, diverged: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.oom, self.diverged = reason, oom, diverged

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,), self.__dict__)  # keeps oom and diverged across a pipe

    @classmethod
    def of(cls, exc: BaseException) -> TrialFailure:
        """The failure an exception raised by a trial stands for."""
        return cls(
            reasons.error_reason(exc), oom=oom.is_oom(exc), diverged=isinstance(exc, Diverged)
        )


class Pruned(Exception):
    """Raised by a study's progress callback to stop a trial that can no longer win; passes through
    every way of running a trial unchanged (a child process or a command is killed first)."""

    def __init__(
        self, reason: str, *, seconds: float | None = None, paused: float | None = None
    ) -> None:
        super().__init__(reason)
        # seconds: the training clock when it was stopped; paused: the seconds off it until then
        self.reason, self.seconds, self.paused = reason, seconds, paused


class RunTrial(Protocol):
    def __call__(
        self,
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult: ...


class Measure(Protocol):
    """Runs a measurement of the task's training, `work(task, *args, device=, seed=)`: a
    module-level function such as rates.measure_in_groups or throughput.measure_in_turn (the
    systems probe's), here or in a child process."""

    def __call__(
        self, work: Callable[..., T], *args: Any, device: torch.device, seed: int
    ) -> T: ...


def resolve(mode: str, device: torch.device) -> str:
    """`auto`: a child process per trial on CUDA, where a trial's memory and CUDA context must go
    back to the system; in-process on CPU, where a child's start-up costs more than it saves."""
    if mode == "auto":
        return "process" if device.type == "cuda" else "none"
    return mode


def warm_up() -> None:
    """Import now what torch imports lazily while a trial's clock runs."""
    for name in LAZY_IMPORTS:
        importlib.import_module(name)


def in_process(task: Task) -> RunTrial:
    """Trials run here; any exception becomes a TrialFailure with its reason."""
    warm_up()

    def run_trial(
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        return as_failure(
            lambda: run(task, config, limits=limits, device=device, seed=seed, progress=progress)
        )

    return run_trial


def as_failure(call: Any) -> Any:
    """`call()`, with anything it raises but Pruned and a signal's stop raised as the TrialFailure
    it stands for, as in a child: a SystemExit (sys.exit in the user's code ends the trial, not the
    study), a KeyboardInterrupt that no signal raised, any other BaseException."""
    try:
        return call()
    except Pruned:
        raise
    except BaseException as exc:
        if signals.by_signal(exc) or isinstance(exc, GeneratorExit):
            raise
        failure = TrialFailure.of(exc)
    # Out of the except block, the traceback and with it the trial's tensors are gone.
    oom.free_memory()
    raise failure


def measure_in_process(task: Task) -> Measure:
    """Measurements here; an error that is not an OOM (those are results) is a TrialFailure."""
    warm_up()

    def measure(work: Callable[..., T], *args: Any, device: torch.device, seed: int) -> T:
        return as_failure(lambda: work(task, *args, device=device, seed=seed))

    return measure


def in_child(task_name: str, *, study_path: Path, hang_after: float) -> RunTrial:
    """Each trial in a fresh child process, killed after `hang_after` seconds of wall time."""
    start = _child_starter(task_name, study_path=study_path, hang_after=hang_after)

    def run_trial(
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        return start(train_trial, (config, limits, device, seed), progress=progress)

    return run_trial


def fork_server(task_name: str) -> Any:
    """The multiprocessing context whose children fork from a server that imported torch, what
    torch imports lazily, the training loop and the task's module (digits' imports scikit-learn,
    0.9 s) once: each child then only builds the task."""
    context = multiprocessing.get_context("forkserver")
    task_module = BUILT_IN.get(task_name, task_name).partition(":")[0]
    context.set_forkserver_preload(["torch", *LAZY_IMPORTS, "autotune.train.trial", task_module])
    return context


def _child_starter(task_name: str, *, study_path: Path, hang_after: float) -> Any:
    """Runs `work(task, progress, *args)` in a fresh child of a fork server and returns its
    result."""
    context = fork_server(task_name)

    def start(work: Any, args: tuple[Any, ...], *, progress: Progress | None) -> Any:
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(
            target=_child_main,
            name="autotune-trial",
            args=(
                sender,
                os.getpid(),
                multiprocessing.get_start_method(),
                task_name,
                study_path,
                work,
                args,
            ),
        )
        child.start()
        under = trial_process.watch(child)
        sender.close()  # so that the child's death reads as end-of-file here
        try:
            kind, value = await_reply(child, receiver, hang_after=hang_after, progress=progress)
            child.join(EXIT_GRACE_SECONDS)  # its memory is back before the next trial starts
            if kind == "error":
                raise value
            return value
        finally:
            receiver.close()
            trial_process.end(child, under)

    return start


def train_trial(
    task: Task,
    progress: Progress,
    config: TrialConfig,
    limits: Limits,
    device: torch.device,
    seed: int,
) -> TrialResult:
    return run(task, config, limits=limits, device=device, seed=seed, progress=progress)


def take_measurement(
    task: Task,
    progress: Progress,
    work: Callable[..., Any],
    args: tuple[Any, ...],
    device: torch.device,
    seed: int,
) -> Any:
    return work(task, *args, device=device, seed=seed)


def await_reply(
    child: Any, receiver: Any, *, hang_after: float, progress: Progress | None
) -> tuple[Any, ...]:
    """The child's last word on its work: ("result", value) or ("error", TrialFailure), and what
    else it sent with it; the progress it reports meanwhile goes to `progress`. A child that says
    nothing within `hang_after` seconds, or dies first, is a TrialFailure."""
    deadline = time.monotonic() + hang_after
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TrialFailure(
                f"timeout: no result after {hang_after:g} s of wall time; "
                f"the trial's process was killed"
            )
        if not receiver.poll(min(remaining, 1.0)):
            continue
        try:
            kind, *payload = receiver.recv()
        except (EOFError, ConnectionResetError):  # the child is gone without a word
            child.join()
            raise TrialFailure(
                f"crashed: {trial_process.exit_description(child.exitcode)}"
            ) from None
        if kind == "progress":
            if progress is not None:
                progress(*payload)
        else:
            return (kind, *payload)


def _child_main(
    sender: Any,
    study_pid: int,
    start_method: str,
    task_name: str,
    study_path: Path,
    work: Any,
    args: tuple[Any, ...],
) -> None:
    """The child: build the task, run `work` (a trial, a probe's measurement), send back the result
    or the failure."""
    trial_process.become_trial_process(study_pid, start_method)
    try:
        task = load_task(task_name, study_path=study_path)
        result = work(task, reporter(sender), *args)
    except BaseException as exc:
        tell(sender, ("error", TrialFailure.of(exc)))
    else:
        tell(sender, ("result", result))
    finally:
        sender.close()


def tell(connection: Any, message: tuple[Any, ...]) -> bool:
    """Send a child's last word to the study; False where the study is gone or has closed its end
    (it was stopped by a signal): nobody is left to tell, and the child ends without a word."""
    try:
        connection.send(message)
    except (OSError, EOFError):
        return False
    return True


def reporter(sender: Any, *, stop: Callable[[], bool] | None = None) -> Progress:
    """A child's progress callback: sends the trial's progress at most every PROGRESS_SECONDS
    (and at every evaluation); raises Pruned where `stop()` says the study asked it to stop. It is
    called at every training step: `stop()` is asked only when progress is due, the study's
    answer to the last progress sent, so no step pays for a look at the pipe."""
    last = 0.0

    def progress(
        steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        nonlocal last
        if metric is not None or time.monotonic() - last >= PROGRESS_SECONDS:
            if stop is not None and stop():
                raise Pruned("stopped by the study")
            last = time.monotonic()
            sender.send(("progress", steps, total, metric, seconds, paused))

    return progress
