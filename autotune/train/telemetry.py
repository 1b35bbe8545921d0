"""What a trial's hardware did while it trained: GPU figures sampled through NVML in the background,
and how long the training loop waited for its next batch.

GPU figures come from NVML (pynvml, the `nvidia-ml-py` distribution). Where there is no NVIDIA GPU,
no driver or no NVML library, they are simply absent (None): no error and no message, since most
CPU machines have the Python package but nothing for it to talk to.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

SAMPLE_SECONDS = 0.1  # NVML's utilisation counter itself averages over 1/6 s to 1 s windows

# One NVML reading: (GPU utilisation %, device memory used in bytes, power draw in milliwatts).
Reading = tuple[float, float, float]


def gpu_summary(readings: list[Reading]) -> dict[str, float] | None:
    """Mean and max utilisation, peak memory used, mean and max power over `readings`; None for
    none.

    Memory used is the whole device's, as nvidia-smi shows it (the CUDA context and other processes
    included): the trial's own allocator peak is `peak_memory_bytes`.
    """
    if not readings:
        return None
    util, used, power = zip(*readings)
    return {
        "util_mean": statistics.fmean(util),
        "util_max": max(util),
        "memory_used_peak_mb": max(used) / 2**20,
        "power_mean_w": statistics.fmean(power) / 1000,
        "power_max_w": max(power) / 1000,
        "samples": len(readings),
    }


def nvml_reader(device: torch.device) -> Callable[[], Reading] | None:
    """A function reading the NVML figures of `device`'s GPU; None off CUDA or without NVML."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = _handle(pynvml, device)
    except Exception:  # no library, no driver, an old driver: the figures are absent, nothing more
        return None

    def read() -> Reading:
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        power = pynvml.nvmlDeviceGetPowerUsage(handle)
        return float(util), float(used), float(power)

    return read


def memory_bytes(device: torch.device) -> int | None:
    """`device`'s memory in bytes, from NVML (no CUDA context started for it); None off CUDA or
    without NVML."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(_handle(pynvml, device)).total)
    except Exception:  # as nvml_reader: the figure is absent, nothing more
        return None


def _handle(pynvml: Any, device: torch.device) -> Any:
    """NVML's handle for the torch device. CUDA_VISIBLE_DEVICES renumbers CUDA's devices but not
    NVML's: where this process has CUDA up, by the device's UUID; else (the study's process,
    watching a command's GPU) through the variable itself, so as not to start a CUDA context just
    for this."""
    index = device.index or 0
    if torch.cuda.is_initialized():
        index = device.index if device.index is not None else torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    visible = [
        v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()
    ]
    if index < len(visible):
        if visible[index].isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(visible[index]))
        return pynvml.nvmlDeviceGetHandleByUUID(visible[index])
    return pynvml.nvmlDeviceGetHandleByIndex(index)


class Sampler:
    """Calls `read` every `every` seconds on a background thread between start() and stop().

    A reading that raises ends the sampling (the GPU went away, NVML was shut down): the trial goes
    on.
    """

    def __init__(
        self, read: Callable[[], Reading] | None, *, every: float = SAMPLE_SECONDS
    ) -> None:
        self._read, self._every = read, every
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Sampler:
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, name="autotune-nvml", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            try:
                self.readings.append(self._read())
            except Exception:
                return
            if self._stop.wait(self._every):
                return

    def stop(self) -> dict[str, float] | None:
        """Stop sampling; the figures (gpu_summary), or None where there is no GPU to read."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return gpu_summary(self.readings)


class InputWait:
    """Seconds the training loop spent waiting for batches: time inside the loader's `next`."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        """`batches`, with the time each `next` takes added to `seconds`."""
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
            yield batch


def wait_fraction(wait: float, elapsed: float) -> float | None:
    """Share of training time spent waiting for input, in [0, 1]; None for no time."""
    return min(1.0, max(0.0, wait / elapsed)) if elapsed > 0 else None
