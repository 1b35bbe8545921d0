"""A run's evaluation: the task's metric over its whole validation set, on the paused clock of
trial.py's loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from autotune.train import class_figures, systems
from autotune.train.tasks import Task

# Evaluation runs on a paused clock, so its batch size only affects study wall time.
EVAL_BATCH_SIZE = 256


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    task: Task,
    *,
    device: torch.device,
    autocast: Callable[[], Any],
    channels_last: bool = False,
) -> tuple[float, list[list[int]] | None]:
    """The task's metric over the whole validation set, and its confusion matrix where the task
    classifies (class_figures.confusion)."""
    model.eval()
    outputs, targets = [], []
    for inputs, target in DataLoader(task.val, batch_size=EVAL_BATCH_SIZE):
        with autocast():
            outputs.append(
                model(
                    systems.to_device(
                        inputs, device, non_blocking=False, channels_last=channels_last
                    )
                ).float()
            )
        targets.append(target.to(device))
    model.train()
    outputs, targets = torch.cat(outputs), torch.cat(targets)
    return float(task.metric(outputs, targets)), class_figures.confusion(outputs, targets)
