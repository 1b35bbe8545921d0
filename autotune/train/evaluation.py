"""A run's evaluation: the task's metric over its whole validation set, on the paused clock of
trial.py's loop."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from autotune.train import class_figures, systems
from autotune.train.loader import pair
from autotune.train.tasks import Task

# Evaluation runs on a paused clock, so its batch size only affects study wall time.
EVAL_BATCH_SIZE = 256
# The most host memory the validation set's collated batches are kept in, between evaluations.
KEEP_BYTES = 1 << 30

Batch = tuple[torch.Tensor, torch.Tensor]
# The last validation set read in this process, and its batches (None: larger than KEEP_BYTES).
_kept: tuple[Dataset, list[Batch] | None] | None = None


def batches(val: Dataset) -> Iterable[Batch]:
    """The validation set in batches of EVAL_BATCH_SIZE: collated once per process and kept where
    they take at most KEEP_BYTES. A run evaluates a dozen times over the same set, and every
    trial of a warm process too; read per sample each time (the shapes task's 10,000 images:
    0.2 s on 2 cores), it held the GPU idle off the clock. Tensors only: other batches, and a
    set too large to keep, are read again each time."""
    if _kept is not None and _kept[0] is val:
        return _kept[1] if _kept[1] is not None else DataLoader(val, batch_size=EVAL_BATCH_SIZE)
    return _collate(val)


def _collate(val: Dataset) -> Iterable[Batch]:
    global _kept
    _kept = None  # the previous set's batches are freed before this one's are collated
    kept: list[Batch] | None = []
    size = 0
    for batch in DataLoader(val, batch_size=EVAL_BATCH_SIZE):
        if kept is not None and _tensors(batch) and (size := size + _bytes(batch)) <= KEEP_BYTES:
            kept.append(batch)
        else:
            kept = None
        yield batch
    _kept = (val, kept)


def _bytes(batch: Batch) -> int:
    return sum(t.numel() * t.element_size() for t in batch)


def _tensors(batch: Any) -> bool:
    return (
        isinstance(batch, Sized)
        and len(batch) == 2
        and all(isinstance(t, torch.Tensor) for t in batch)
    )


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
    for inputs, target in (pair(batch, "validation set") for batch in batches(task.val)):
        moved = systems.to_device(inputs, device, non_blocking=False, channels_last=channels_last)
        if moved.data_ptr() == inputs.data_ptr():  # a kept batch, which a model may change in place
            moved = moved.clone()
        with autocast():
            outputs.append(model(moved).float())
        targets.append(target.to(device))
    model.train()
    outputs, targets = torch.cat(outputs), torch.cat(targets)
    return float(task.metric(outputs, targets)), class_figures.confusion(outputs, targets)
