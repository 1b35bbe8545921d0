"""Trials in a child process kept warm between them (`isolation: warm`).

A fresh child per trial pays in every trial what only the first needs: the CUDA context and the
task's dataset read into memory (2.7 s a trial on an H100 with the shapes task, against trials
of 5 s). A warm child builds them once and runs trial after trial. It keeps a fresh child's
promises by being replaced:

- after a trial that failed (an OOM, an error, a divergence): the next trial starts in a new child;
- after a trial that left something behind (`left_behind`): device memory still allocated, a
  process it started still running, a Python thread still running, file descriptors open past
  DESCRIPTOR_GROWTH, or its resident memory grown past RSS_GROWTH_BYTES;
- after TRIALS_PER_CHILD trials, whatever they left;
- before a trial with cuDNN's search (cudnn_benchmark) where an earlier one searched: cuDNN keeps
  the algorithms it found for the process, and the trial would find them rather than pay for the
  search, as a run of its own would.

What a trial's code sets for the whole process (the default dtype, autograd's modes, torch's
threads, the deterministic and TF32 switches, the random generators: `Settings`) is put back after
each trial, as a fresh child would have it. A hang is killed at its limit and a crash recorded
exactly as in a fresh child. A trial the study prunes is stopped inside the child, which then
waits for the next one.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import random
import threading
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
DESCRIPTOR_GROWTH = 16  # open file descriptors added since the first trial ended
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
                settings = Settings.now()
            try:
                reply: tuple[Any, ...] = ("result", work(task, progress, *args))
            finally:
                settings.restore()  # the next trial starts as a fresh child would
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


@dataclasses.dataclass(frozen=True)
class Settings:
    """The process-wide settings a trial's code may change and a fresh child would not have: the
    default dtype, autograd's modes, torch's threads, the deterministic and TF32 switches, the
    random generators. Taken before the first trial, put back after each."""

    values: tuple[Any, ...]
    rng: tuple[Any, ...]

    @classmethod
    def now(cls) -> Settings:
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        return cls(
            (
                torch.get_default_dtype(),
                torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(),
                torch.is_anomaly_enabled(),
                torch.get_num_threads(),
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.get_float32_matmul_precision(),
                cudnn.benchmark,
                cudnn.deterministic,
                cudnn.allow_tf32,
                matmul.allow_tf32,
            ),
            (torch.get_rng_state(), random.getstate()),
        )

    def restore(self) -> None:
        """Each setting back where it differs (setting TF32's switches where they do not would pin
        torch's finer per-backend settings)."""
        if Settings.now().values == self.values:
            self._restore_rng()
            return
        (dtype, grad, _, anomaly, threads, deterministic, warn_only, precision) = self.values[:8]
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)  # inference mode is a context: it cannot be left on
        torch.set_anomaly_enabled(anomaly)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        if torch.get_float32_matmul_precision() != precision:
            torch.set_float32_matmul_precision(precision)
        cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
        benchmark, cudnn_deterministic, cudnn_tf32, matmul_tf32 = self.values[8:12]
        cudnn.benchmark, cudnn.deterministic = benchmark, cudnn_deterministic
        if cudnn.allow_tf32 != cudnn_tf32:
            cudnn.allow_tf32 = cudnn_tf32
        if matmul.allow_tf32 != matmul_tf32:
            matmul.allow_tf32 = matmul_tf32
        self._restore_rng()

    def _restore_rng(self) -> None:
        torch.set_rng_state(self.rng[0])
        random.setstate(self.rng[1])


class _Footprint:
    """What a trial may leave in its process: device memory, resident memory, child processes,
    Python threads still running, open file descriptors."""

    def __init__(
        self,
        device_bytes: int,
        rss_bytes: int,
        children: list[int],
        threads: frozenset[int] = frozenset(),
        descriptors: int = 0,
    ) -> None:
        self.device_bytes, self.rss_bytes, self.children = device_bytes, rss_bytes, children
        self.threads, self.descriptors = threads, descriptors

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
        threads = frozenset(t.ident for t in threading.enumerate() if t.ident is not None)
        return cls(device_bytes, _rss_bytes(), children, threads, len(os.listdir("/proc/self/fd")))


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
    running = after.threads - before.threads
    if running:  # a thread left spinning slows every later trial in the process
        return f"a trial left {len(running)} thread(s) running"
    opened = after.descriptors - first.descriptors  # the first trial opens the device's for good
    if opened > DESCRIPTOR_GROWTH:
        return f"a trial left {opened} more file descriptors open than the first trial"
    grown = after.rss_bytes - first.rss_bytes
    if grown > RSS_GROWTH_BYTES:
        return f"its resident memory grew by {grown / 2**20:.0f} MiB since its first trial"
    return None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
