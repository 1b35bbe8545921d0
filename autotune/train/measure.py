"""Measuring a trial honestly: a pausable clock, peak memory, the device, CPU threads."""

from __future__ import annotations

import functools
import os
import platform
import resource
import time

import torch

from autotune.train.recipe import training_threads


class Clock:
    """Training time that can be paused; synchronizes CUDA before every measured read."""

    def __init__(self, device: torch.device) -> None:
        self._sync = functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else (lambda: None)
        self.elapsed = 0.0
        self._started: float | None = None

    @property
    def running(self) -> bool:
        return self._started is not None

    def start(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        self.elapsed += time.perf_counter() - self._started
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
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_for(num_workers: int) -> int:
    """Torch threads for the training process on this machine (recipe.training_threads)."""
    return training_threads(cpu_count(), num_workers)


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
