"""A synthetic task whose loading and compute costs are set, not found: the roofline's test bench.

Loading a sample waits `load_seconds` in whichever process loads it (a DataLoader worker, or the
training process with none); a training step waits `compute_seconds` a sample, `narrow_factor`
of that under a 16-bit autocast, and `step_seconds` a step whatever its batch (a GPU's kernel
launches and small kernels: what makes a larger micro-batch faster a sample; none by default);
a model's first 16-bit step waits `narrow_start_seconds` more (as a trial in a fresh process on
a GPU loads its narrow kernels and runs cuDNN's search for them: a faster rate that starts
later), and the first training step of any model of the task `first_step_seconds` (a process's
first steps on a GPU, loading what every later one reuses); a DataLoader worker waits
`worker_start_seconds` before its first batch (its start-up: what more workers pay, and no
workers do not); none by default. With `device_load_seconds` the training set is kept on the
device as well (Task.device_train), each batch gathered there waiting that long a sample.
Both wait rather than spin, so that on two cores four loader workers really load four times as
fast, as they would on a GPU host with cores to spare: the loader's rate is then workers /
load_seconds, the compute's 1 / compute_seconds, and a setting's speed the slower of the two (the
sum of both costs with no workers).

The defaults make deciding one knob at a time go wrong, as on a real GPU host: at fp32 two loader
workers already outrun the compute, so a loader chosen at fp32 stops at two; at two workers bf16
gains only 1.25x and the loader holds it there; bf16 with four workers runs 2x fp32. The data are
Gaussian points whose class is two exclusive-ors of pairs of their coordinates, which a small MLP
learns to 92% in one to three epochs, depending on its learning rate and batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from autotune.train.tasks import Task

LOAD_SECONDS = 0.8e-3  # a sample, in the process that loads it
COMPUTE_SECONDS = 0.5e-3  # a sample of a training step at fp32
NARROW_FACTOR = 0.5  # of the compute under a 16-bit autocast
FEATURES, CLASSES, HIDDEN = 8, 4, 64
TRAIN, VAL = 4096, 512
DATA_SEED = 0  # the data are part of the task: fixed


class PacedSamples(Dataset):
    """Gaussian blobs that take `load_seconds` a sample to load, and a DataLoader worker
    `worker_start_seconds` before its first batch."""

    def __init__(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        *,
        load_seconds: float,
        worker_start_seconds: float = 0.0,
    ) -> None:
        self.inputs, self.labels, self.load_seconds = inputs, labels, load_seconds
        self.worker_start_seconds = worker_start_seconds  # each worker its own copy, spent once

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        # A DataLoader fetches a batch in one call here: one wait, as precise as the clock allows.
        start = 0.0
        if get_worker_info() is not None:  # the training process's own copy keeps it
            start, self.worker_start_seconds = self.worker_start_seconds, 0.0
        time.sleep(start + self.load_seconds * len(indices))
        return [(self.inputs[i], self.labels[i]) for i in indices]


class PacedModel(nn.Module):
    """A small MLP whose training forward pass waits as the set compute cost says."""

    def __init__(
        self,
        *,
        compute_seconds: float,
        narrow_factor: float,
        step_seconds: float = 0.0,
        narrow_step_seconds: float = 0.0,
        narrow_start_seconds: float = 0.0,
        first_use: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
        )
        self.compute_seconds, self.narrow_factor = compute_seconds, narrow_factor
        self.step_seconds = step_seconds
        self.narrow_step_seconds = narrow_step_seconds  # a 16-bit step's fixed cost: its casts
        self.narrow_start_seconds = narrow_start_seconds  # paid once, then spent
        self.first_use = first_use if first_use is not None else {}  # shared by the task's models

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:  # evaluation runs off the clock: no need to wait there
            device = inputs.device.type
            narrow = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in (
                torch.bfloat16,
                torch.float16,
            )
            per_sample = self.compute_seconds * (self.narrow_factor if narrow else 1.0)
            start = (self.narrow_start_seconds if narrow else 0.0) + self.first_use.pop(
                "seconds", 0.0
            )
            if narrow:
                self.narrow_start_seconds = 0.0
            step = self.step_seconds + (self.narrow_step_seconds if narrow else 0.0)
            time.sleep(start + step + per_sample * len(inputs))
        return self.layers(inputs)


def make(
    *,
    load_seconds: float = LOAD_SECONDS,
    compute_seconds: float = COMPUTE_SECONDS,
    narrow_factor: float = NARROW_FACTOR,
    step_seconds: float = 0.0,
    narrow_step_seconds: float = 0.0,
    narrow_start_seconds: float = 0.0,
    first_step_seconds: float = 0.0,
    worker_start_seconds: float = 0.0,
    device_load_seconds: float | None = None,
) -> Task:
    """The task with the given costs (seconds a sample, a step, a 16-bit step's more, a model's
    first 16-bit step, the first step of all, and a training loader worker's first batch); with
    `device_load_seconds`, its training set kept on the device too, gathered there at that cost a
    sample."""
    inputs = torch.randn(TRAIN + VAL, FEATURES, generator=torch.Generator().manual_seed(DATA_SEED))
    positive = inputs[:, :4] > 0
    labels = (positive[:, 0] ^ positive[:, 1]).long() + 2 * (positive[:, 2] ^ positive[:, 3]).long()

    first_use = {"seconds": first_step_seconds}

    def model() -> PacedModel:
        return PacedModel(
            compute_seconds=compute_seconds,
            narrow_factor=narrow_factor,
            step_seconds=step_seconds,
            narrow_step_seconds=narrow_step_seconds,
            narrow_start_seconds=narrow_start_seconds,
            first_use=first_use,
        )

    return Task(
        model=model,
        train=PacedSamples(
            inputs[:TRAIN],
            labels[:TRAIN],
            load_seconds=load_seconds,
            worker_start_seconds=worker_start_seconds,
        ),
        val=PacedSamples(inputs[TRAIN:], labels[TRAIN:], load_seconds=0.0),
        device_train=(
            None
            if device_load_seconds is None
            else _device_train(inputs[:TRAIN], labels[:TRAIN], device_load_seconds)
        ),
    )


def _device_train(
    inputs: torch.Tensor, labels: torch.Tensor, load_seconds: float
) -> Callable[[torch.device], Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """Task.device_train: the samples PacedSamples gives, each batch waiting `load_seconds` a
    sample."""

    def on(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        kept_inputs, kept_labels = inputs.to(device), labels.to(device)

        def gather(indices: torch.Tensor, keys: Any) -> tuple[torch.Tensor, torch.Tensor]:
            time.sleep(load_seconds * len(indices))
            indices = indices.to(device)
            return kept_inputs[indices], kept_labels[indices]

        return gather

    return on


def task() -> Task:
    """The built-in `paced` task, with the default costs."""
    return make()
