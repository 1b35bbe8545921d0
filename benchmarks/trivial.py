"""A trivial task for benchmarks/overhead.py: a linear model on 512 random points, so a trial's
training is a few milliseconds and everything else the tuner does shows."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune import Task


def _points(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


def task() -> Task:
    return Task(model=lambda: nn.Linear(8, 2), train=_points(512, 0), val=_points(128, 1))
