"""MNIST-1D (Greydanus, 2020): 5,000 one-dimensional digit signals of length 40, generated
locally by `mnist1d.data.make_dataset()` (never downloaded), with a small 1-D CNN.

Unlike `digits`, the data sits in memory as tensors: loading is nearly free and the trial is
compute-bound, so precision and batch size matter more than DataLoader workers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.train.tasks import Task


class Conv1dNet(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, width, 5, padding=2),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, padding=1, stride=2),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, padding=1, stride=2),
            nn.ReLU(),
        )
        self.head = nn.Linear(width * 10, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x[:, None]).flatten(1))


def task() -> Task:
    from mnist1d.data import get_dataset_args, make_dataset  # slow to import; only when used

    data = make_dataset(get_dataset_args())  # seeded by its own args: the same data every time

    def tensors(x: object, y: object) -> TensorDataset:
        return TensorDataset(
            torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
        )

    return Task(
        model=Conv1dNet,
        train=tensors(data["x"], data["y"]),
        val=tensors(data["x_test"], data["y_test"]),
    )
