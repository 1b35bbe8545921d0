"""Measuring a trial honestly: a pausable clock, peak memory, the device, CPU threads, and how
busy other processes kept this machine's cores."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
import resource
import time
from collections.abc import Iterator

import torch

from autotune.search.recipe import cores, training_threads


class Clock:
    """Training time that can be paused; synchronizes CUDA before every measured read. `paused`:
    the wall time off it since it first started (evaluations, the end's shutdown)."""

    def __init__(self, device: torch.device) -> None:
        self._sync = (
            functools.partial(torch.cuda.synchronize, device)
            if device.type == "cuda"
            else (lambda: None)
        )
        self.elapsed = 0.0
        self._started: float | None = None
        self._stopped: float | None = None
        self._paused = 0.0

    @property
    def running(self) -> bool:
        return self._started is not None

    @property
    def paused(self) -> float:
        since = 0.0 if self._stopped is None else time.perf_counter() - self._stopped
        return self._paused + since

    def start(self) -> None:
        self._sync()
        self._started = time.perf_counter()
        if self._stopped is not None:
            self._paused += self._started - self._stopped
            self._stopped = None

    def stop(self) -> float:
        self._sync()
        self._stopped = time.perf_counter()
        self.elapsed += self._stopped - self._started
        self._started = None
        return self.elapsed

    def read(self, *, sync: bool = True) -> float:
        """Elapsed time; `sync=False` for limit checks, where a stall per step would cost more."""
        if self._started is None:
            return self.elapsed
        if sync:
            self._sync()
        return self.elapsed + time.perf_counter() - self._started


def cpu_count() -> int:
    return cores()


def threads_for(num_workers: int, *, processes: int = 1) -> int:
    """Torch threads for each of `processes` training processes on this machine
    (recipe.training_threads)."""
    return training_threads(cpu_count(), num_workers, processes=processes)


@dataclasses.dataclass
class OtherLoad:
    """Cores that other processes kept busy, on average, while a block ran: the busy CPU time of
    this process's cores (Linux's /proc/stat) beyond what this process and its descendants (trial
    children, DataLoader workers) used. None where /proc is missing, or until the block ends."""

    cores: float | None = None

    def record(self) -> dict[str, float | int | None]:
        """As a systems measurement stores it: the cores others kept busy, of how many."""
        return {"other_cores": self.cores, "cores": cpu_count()}


class LoadMeter:
    """Cores other processes have kept busy, on average, since it was made (OtherLoad's figure),
    read at any moment: None where /proc is missing."""

    def __init__(self) -> None:
        self._busy, self._own, self._started = _busy_seconds(), _own_seconds(), time.perf_counter()

    def cores(self, *, after: float = 0.0) -> float | None:
        """None before `after` seconds too: the counters tick in hundredths of a second, so a
        figure over a moment is their rounding."""
        busy, own, wall = _busy_seconds(), _own_seconds(), time.perf_counter() - self._started
        if None in (self._busy, busy, self._own, own) or wall <= max(after, 0.0):
            return None
        return max(0.0, (busy - self._busy - (own - self._own)) / wall)


@contextlib.contextmanager
def other_load() -> Iterator[OtherLoad]:
    """Measure OtherLoad over the block. Systems measurements (the probe) and trials record it: a
    choice made while another job used the cores is that load's choice."""
    load, meter = OtherLoad(), LoadMeter()
    try:
        yield load
    finally:
        load.cores = meter.cores()


def _busy_seconds() -> float | None:
    """CPU seconds spent busy so far on the cores this process may run on."""
    cores = {
        f"cpu{i}" for i in (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ())
    }
    try:
        with open("/proc/stat") as stat:
            lines = [
                line.split()
                for line in stat
                if line.startswith("cpu") and not line.startswith("cpu ")
            ]
    except OSError:
        return None
    ticks = 0
    for name, *fields in lines:
        if cores and name not in cores:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(v) for v in fields)
        ticks += user + nice + system + irq + softirq + (rest[0] if rest else 0)  # rest[0]: steal
    return ticks / os.sysconf("SC_CLK_TCK") if lines else None


def _own_seconds() -> float | None:
    """CPU seconds this process and its descendants have used, the exited ones included (their
    time is in their parent's cumulative figures once waited for). A forkserver's trial children
    are descendants too, which os.times() would miss."""
    parents: dict[int, int] = {}
    seconds: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                # after the name, which may hold spaces
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # fields: state ppid ... utime(11) stime(12) cutime(13) cstime(14)
        parents[int(pid)] = int(fields[1])
        seconds[int(pid)] = sum(int(v) for v in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += seconds.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak-memory figure afresh for this trial.

    On CPU the figure is the process's peak resident memory. Linux resets it when "5" is written to
    /proc/self/clear_refs; elsewhere (or where that is refused) it stays the process's lifetime
    peak, which in-process trials then share.
    """
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def peak_memory(device: torch.device) -> int:
    """CUDA: the allocator's peak since reset_peak_memory. CPU: the process's peak resident memory
    (VmHWM), DataLoader workers not included."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def allocator_mark(device: torch.device) -> int:
    """The bytes the device's allocator holds now, its peak reset to them: what is built after
    the mark peaks at counts from there (allocator_peak_since). CUDA; 0 elsewhere."""
    if device.type != "cuda":
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def allocator_peak_since(device: torch.device, mark: int) -> int | None:
    """The allocator's peak since allocator_mark, less what it held at the mark (CUDA; None
    elsewhere)."""
    return torch.cuda.max_memory_allocated(device) - mark if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return f"cpu ({line.split(':', 1)[1].strip()})"
    except OSError:
        pass
    return f"cpu ({platform.processor() or platform.machine()})"
