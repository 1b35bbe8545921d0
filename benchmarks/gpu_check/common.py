"""What every stage of the GPU check shares: where it runs, the GPU's memory as the driver and the
allocator count it, where the results go and what produced them."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from benchmarks.provenance import REPO, RESULTS, provenance


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where the check runs. On CUDA it measures the real thing; `--cpu` runs each stage's plumbing
    on the CPU at a small size (the test suite does), so that the first person with a GPU finds
    stages that already run."""

    device: torch.device
    task: str  # the shapes task at the size this device trains in minutes
    results: Path

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def python(self) -> str:
        return sys.executable


def setting(*, cpu: bool, results: Path = RESULTS) -> Setting | None:
    """The setting to check in; None when a GPU check was asked for and there is no GPU."""
    if cpu:
        return Setting(torch.device("cpu"), "autotune.train.tasks.shapes:small", results)
    if not torch.cuda.is_available():
        return None
    return Setting(torch.device("cuda"), "shapes", results)


def gpu_identity() -> dict[str, Any]:
    """GPU name, memory and driver as NVML reports them; empty without an NVIDIA GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver here
        return {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        return {
            "gpu": name.decode() if isinstance(name, bytes) else name,
            "gpu_memory_gib": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30,
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_runtime": torch.version.cuda,
        }
    finally:
        pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def memory_in_use(device: torch.device) -> dict[str, int | None]:
    """GPU memory in use now: by every process (NVML, the driver's count, CUDA contexts included)
    and by this process's caching allocator. None where not measurable (no GPU)."""
    figures: dict[str, int | None] = {"nvml_used": None, "allocated": None, "reserved": None}
    if device.type != "cuda":
        return figures
    import pynvml

    pynvml.nvmlInit()
    try:
        figures["nvml_used"] = int(
            pynvml.nvmlDeviceGetMemoryInfo(
                pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            ).used
        )
    finally:
        pynvml.nvmlShutdown()
    if torch.cuda.is_initialized():  # reading the allocator must not create a CUDA context here
        figures["allocated"] = torch.cuda.memory_allocated(device)
        figures["reserved"] = torch.cuda.memory_reserved(device)
    return figures


def interleaved(
    runners: Mapping[str, Callable[[int], Any]], *, rounds: int, warm_up: bool = True
) -> dict[str, list[Any]]:
    """Run each runner once per round, in turn, so that drift on the machine falls on all alike.
    A first round (discarded) warms up caches, compilers and fork servers."""
    samples: dict[str, list[Any]] = {name: [] for name in runners}
    for index in range(rounds + (1 if warm_up else 0)):
        for name, run in runners.items():
            value = run(index)
            if index > 0 or not warm_up:
                samples[name].append(value)
    return samples


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def write(setting_: Setting, stage: str, figures: dict[str, Any]) -> Path:
    """benchmarks/results/gpu-check-<stage>-<cuda|cpu>.json, with what produced it."""
    setting_.results.mkdir(parents=True, exist_ok=True)
    path = setting_.results / f"gpu-check-{stage}-{setting_.device.type}.json"
    record = {"stage": stage, **provenance(setting_.device), **gpu_identity(), **figures}
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


__all__ = [
    "REPO",
    "Setting",
    "gpu_identity",
    "interleaved",
    "median",
    "memory_in_use",
    "mib",
    "setting",
    "write",
]
