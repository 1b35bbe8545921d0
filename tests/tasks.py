"""Small tasks for tests: train in well under a second on CPU, and fail on purpose where asked."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune import Task

OOM_BATCH = 128  # forward passes on at least this many samples run out of memory


def _blobs(n: int, seed: int) -> TensorDataset:
    """Four Gaussian blobs in 8 dimensions: easy to learn, not instant."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = torch.eye(4, 8) * 3
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def blobs() -> Task:
    return Task(model=_mlp, train=_blobs(1024, 0), val=_blobs(512, 1))


class CudaOOMAtLargeBatch(nn.Module):
    """Raises torch.cuda.OutOfMemoryError, as the CUDA allocator does, for large batches."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) >= OOM_BATCH:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(x)} GiB")
        return self.net(x)


class CpuOOMAtLargeBatch(CudaOOMAtLargeBatch):
    """Really exhausts the CPU allocator for large batches: asks for an impossible buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) >= OOM_BATCH:
            torch.empty(2**62, dtype=torch.uint8)
        return self.net(x)


def cuda_oom() -> Task:
    return Task(model=CudaOOMAtLargeBatch, train=_blobs(1024, 0), val=_blobs(512, 1))


def cpu_oom() -> Task:
    return Task(model=CpuOOMAtLargeBatch, train=_blobs(1024, 0), val=_blobs(512, 1))


def broken_model() -> Task:
    def model() -> nn.Module:
        raise ValueError("this model cannot be built")

    return Task(model=model, train=_blobs(256, 0), val=_blobs(128, 1))
