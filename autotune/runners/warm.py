"""Trials in a child process kept warm between them (`isolation: warm`).

A fresh child per trial pays in every trial what only the first needs: the CUDA context and the
task's dataset read into memory (2.7 s a trial on an H100 with the shapes task, against trials
of 5 s). A warm child builds them once and runs trial after trial. It keeps a fresh child's
promises by being replaced:

- after a trial that failed (an OOM, an error, a divergence): the next trial starts in a new child;
- after a trial that left something behind (`left_behind`): device memory still allocated, a
  process it started still running, or its resident memory grown past RSS_GROWTH_BYTES;
- after TRIALS_PER_CHILD trials, whatever they left;
- before a trial with cuDNN's search (cudnn_benchmark) where an earlier one searched: cuDNN keeps
  the algorithms it found for the process, and the trial would find them rather than pay for the
  search, as a run of its own would.

A hang is killed at its limit and a crash recorded exactly as in a fresh child. A trial the study
prunes is stopped inside the child, which then waits for the next one.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch._dynamo

from autotune.runners import descendants, isolation, trial_process
from autotune.runners.isolation import Pruned, TrialFailure
from autotune.train.config import Limits, Progress, TrialConfig, TrialResult
from autotune.train.tasks import Task, load_task

T = TypeVar("T")
TRIALS_PER_CHILD = 25  # a bound on what slow leaks no single trial shows can add up to
# device memory still allocated after a trial, beyond what the task holds
DEVICE_LEAK_BYTES = 64 << 20
RSS_GROWTH_BYTES = 1 << 30  # resident memory grown since the first trial ended
STOP_SECONDS = 10.0  # how long a pruned trial's child gets to stop before it is killed
SETTLE_SECONDS = 2.0  # how long a trial's DataLoader workers get to exit after it ends


class WarmChild:
    """One child process at a time, running the study's trials and measurements in turn:
    `run_trial` and `measure` are a RunTrial and a Measure. A trial gets `hang_after` seconds of
    wall time, a measurement `measure_hang_after`."""

    def __init__(
        self,
        task_name: str,
        *,
        study_path: Path,
        hang_after: float,
        measure_hang_after: float,
        notice: Callable[[str], None] | None = None,
    ) -> None:
        self.task_name, self.study_path = task_name, study_path
        self.hang_after, self.measure_hang_after = hang_after, measure_hang_after
        # told why a child that served well was replaced (a failed trial says so itself)
        self.notice = notice
        self.replaced: list[str] = []  # why each earlier child was let go, oldest first
        self._held = _Held()
        # Dropping the runners ends the child (a study run from the Python API, a test); the
        # child's watchdog ends it anyway when this process is gone.
        weakref.finalize(self, self._held.end)

    def run_trial(
        self,
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        if config.cudnn_benchmark and self._held.searched:
            self._replace("an earlier trial in it had searched cuDNN's algorithms")
        self._held.searched = self._held.searched or config.cudnn_benchmark
        return self._run(
            isolation.train_trial,
            (config, limits, device, seed),
            device=device,
            hang_after=self.hang_after,
            progress=progress,
        )

    def measure(self, work: Callable[..., T], *args: Any, device: torch.device, seed: int) -> T:
        return self._run(
            isolation.take_measurement,
            (work, args, device, seed),
            device=device,
            hang_after=self.measure_hang_after,
            progress=None,
        )

    @property
    def pid(self) -> int | None:
        """The child's process id, None between a child's end and the next trial."""
        return self._held.child.pid if self._held.child is not None else None

    def close(self) -> None:
        self._held.end()

    def _run(
        self,
        work: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        device: torch.device,
        hang_after: float,
        progress: Progress | None,
    ) -> Any:
        """`work(task, progress, *args)` in the warm child, started first where there is none."""
        held = self._held
        if held.child is None:
            held.start(isolation.fork_server(self.task_name), self.task_name, self.study_path)
        held.connection.send(("work", work, args, device))
        try:
            kind, value, left = isolation.await_reply(
                held.child, held.connection, hang_after=hang_after, progress=progress
            )
        except Pruned:
            self._stop_trial()
            raise
        except BaseException as exc:  # a timeout, a crash, this process stopped by a signal
            self._replace(exc.reason if isinstance(exc, TrialFailure) else None)
            raise
        if kind == "error":
            self._replace(f"its trial failed: {value.reason}")
            raise value
        if left:
            self._replace(left, tell=True)
        return value

    def _stop_trial(self) -> None:
        """Ask the child to stop the trial the study pruned; a child that does not stop within
        STOP_SECONDS, fails as it stops, or was left something by the trial, is replaced."""
        held = self._held
        try:
            held.connection.send(("stop",))
            # Its result may already be on the way: that ends the trial as well.
            kind, value, left = isolation.await_reply(
                held.child, held.connection, hang_after=STOP_SECONDS, progress=None
            )
        except (TrialFailure, OSError) as exc:
            self._replace(f"a pruned trial did not stop: {exc}", tell=True)
            return
        if kind == "error":
            self._replace(f"a pruned trial failed as it stopped: {value.reason}", tell=True)
        elif left:
            self._replace(left, tell=True)

    def _replace(self, reason: str | None, *, tell: bool = False) -> None:
        """End the child; the next trial starts a new one."""
        self._held.end()
        if reason:
            self.replaced.append(reason)
            if tell and self.notice is not None:
                self.notice(f"the warm trial process was replaced: {reason}")


class _Held:
    """The child process and its end of the pipe; apart from WarmChild so that its finalizer can
    end them without keeping the WarmChild alive."""

    child: Any = None
    connection: Any = None
    under: Any = None  # what ends every process under the child with it (trial_process.watch)
    searched = False  # whether a trial in the child ran cuDNN's algorithm search

    def start(self, context: Any, task_name: str, study_path: Path) -> None:
        here, there = context.Pipe(duplex=True)
        child = context.Process(
            target=_serve,
            name="autotune-warm-trial",
            args=(there, os.getpid(), multiprocessing.get_start_method(), task_name, study_path),
        )
        try:
            child.start()
        finally:
            there.close()  # so that the child's death reads as end-of-file here
        self.child, self.connection, self.under = child, here, trial_process.watch(child)

    def end(self) -> None:
        self.searched = False
        if self.child is None:
            return
        child, connection, under = self.child, self.connection, self.under
        self.child = self.connection = self.under = None
        under.sample(now=True)  # while the child lives: what it left running is under it
        connection.close()  # a waiting child reads end-of-file and leaves on its own
        child.join(SETTLE_SECONDS)
        trial_process.end(child, under)


def _serve(
    connection: Any, study_pid: int, start_method: str, task_name: str, study_path: Path
) -> None:
    """The warm child: build the task once, then run each piece of work the study sends, until
    one fails or leaves something behind, or the study closes the pipe."""
    trial_process.become_trial_process(study_pid, start_method)
    progress = isolation.reporter(
        connection, stop=lambda: connection.poll() and connection.recv()[0] == "stop"
    )
    task: Task | None = None
    before = first = None  # the footprint before the first trial (the task built), and after it
    served = 0
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        if request[0] != "work":
            continue  # a stop that came after its trial had already ended
        _, work, args, device = request
        try:
            if task is None:
                task = load_task(task_name, study_path=study_path)
                # What is here now (torch, the task's data) lives as long as the child: left out of
                # every later collection, which then takes microseconds rather than 0.2 s.
                gc.freeze()
                before = _Footprint.now(device)
            reply: tuple[Any, ...] = ("result", work(task, progress, *args))
        except Pruned:
            reply = ("stopped", None)
        except BaseException as exc:
            isolation.tell(connection, ("error", TrialFailure.of(exc), None))
            return  # a failed trial's process is not used again
        served += 1
        after = _Footprint.now(device, known=before.children)
        first = first or after
        left = left_behind(before, first, after) or (
            f"it had run {served} trials, the most one process runs"
            if served >= TRIALS_PER_CHILD
            else None
        )
        if not isolation.tell(connection, (*reply, left)) or left:
            return


class _Footprint:
    """What a trial may leave in its process: device memory, resident memory, child processes."""

    def __init__(self, device_bytes: int, rss_bytes: int, children: list[int]) -> None:
        self.device_bytes, self.rss_bytes, self.children = device_bytes, rss_bytes, children

    @classmethod
    def now(cls, device: torch.device, *, known: Sequence[int] = ()) -> _Footprint:
        """Taken once what the last trial dropped is collected, and processes it started other
        than `known` had a moment to exit."""
        gc.collect()  # a pruned trial's frames, its DataLoader iterator among them
        # a compiled trial's graphs: the next trial's model would recompile into the limit
        torch._dynamo.reset()
        device_bytes = 0
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            # cuBLAS keeps its workspaces (tens of MiB on a recent GPU) in the caching allocator
            # after a process's first matrix product: the process's, not a trial's leak.
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()
            device_bytes = torch.cuda.memory_allocated(device)
        deadline = time.monotonic() + SETTLE_SECONDS
        while (
            set(children := descendants.children(os.getpid())) - set(known)
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)  # DataLoader workers that were told to exit
        return cls(device_bytes, _rss_bytes(), children)


def left_behind(before: _Footprint, first: _Footprint, after: _Footprint) -> str | None:
    """Why a child should not run another trial after one that left `after`, or None."""
    held = after.device_bytes - before.device_bytes
    if held > DEVICE_LEAK_BYTES:
        return f"a trial left {held / 2**20:.0f} MiB of device memory allocated"
    started = [pid for pid in after.children if pid not in before.children]
    if started:
        return (
            f"a trial left {len(started)} process(es) running (pid {', '.join(map(str, started))})"
        )
    grown = after.rss_bytes - first.rss_bytes
    if grown > RSS_GROWTH_BYTES:
        return f"its resident memory grew by {grown / 2**20:.0f} MiB since its first trial"
    return None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
