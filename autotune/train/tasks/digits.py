"""scikit-learn's handwritten digits (1,797 images, bundled, offline) with a small CNN.

Images are upsampled to 16x16 once; each training sample is then randomly rotated, scaled and
shifted in `__getitem__`, so loading costs real CPU time and DataLoader settings matter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from autotune.train.tasks import Task, augmentation_rng

SIDE = 16  # pixels; the 8x8 originals are too small for three conv layers
VAL_FRACTION = 0.2
SPLIT_SEED = 0  # the split is part of the task, not of a trial: fixed


class Digits(Dataset):
    """Digit images with optional per-sample affine augmentation, drawn from the sample's key."""

    keyed = True  # the trial's loader gives (index, key): tasks.augmentation_rng

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, *, augment: bool) -> None:
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        index, rng = augmentation_rng(item)
        image = self.images[index]
        if self.augment:
            image = _warped(image[None], [_random_affine(rng)])[0]
        return image, self.labels[index]


def _random_affine(rng: torch.Generator | None) -> list[list[float]]:
    """A rotation up to 12 degrees, a scaling by 0.9-1.1 and a shift up to 1.5 pixels, drawn from
    `rng`: affine_grid's 2 x 3 matrix."""
    angle, scale, dx, dy = (torch.rand(4, generator=rng) * 2 - 1).tolist()
    angle, scale = math.radians(12) * angle, 1 + 0.1 * scale
    cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
    shift = 1.5 * 2 / SIDE  # pixels in grid units
    return [[cos, -sin, dx * shift], [sin, cos, dy * shift]]


def _random_affines(keys: list[int]) -> torch.Tensor:
    """_random_affine for each key's generator at once (N x 2 x 3): the same draws and the same
    sums in float64, in a few tensor operations rather than a few Python ones a sample."""
    draws = torch.stack([torch.rand(4, generator=augmentation_rng((0, k))[1]) for k in keys])
    angle, scale, dx, dy = (draws.double() * 2 - 1).unbind(1)
    angle, scale = math.radians(12) * angle, 1 + 0.1 * scale
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    shift = 1.5 * 2 / SIDE
    rows = [torch.stack([cos, -sin, dx * shift], 1), torch.stack([sin, cos, dy * shift], 1)]
    return torch.stack(rows, 1).float()


def _warped(images: torch.Tensor, theta: torch.Tensor | list[list[list[float]]]) -> torch.Tensor:
    """Each image (N x 1 x SIDE x SIDE) warped by its 2 x 3 matrix of `theta`, bilinearly."""
    theta = torch.as_tensor(theta, dtype=torch.float32).to(images.device)
    grid = F.affine_grid(theta, [len(images), 1, SIDE, SIDE], align_corners=False)
    return F.grid_sample(images, grid, align_corners=False)


def _device_train(
    images: torch.Tensor, labels: torch.Tensor
) -> Callable[[torch.device], Callable[..., Any]]:
    """Task.device_train: the images copied to the device and each batch augmented there at once,
    each sample as Digits gives it for the same key."""

    def on(device: torch.device) -> Callable[..., Any]:
        images_there, labels_there = images.to(device), labels.to(device)

        def gather(indices: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            indices = indices.to(device)
            warped = _warped(images_there[indices], _random_affines(keys.tolist()))
            return warped, labels_there[indices]

        return gather

    return on


class SmallCNN(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()
            )

        self.features = nn.Sequential(
            block(1, width),
            nn.MaxPool2d(2),
            block(width, 2 * width),
            nn.MaxPool2d(2),
            block(2 * width, 2 * width),
        )
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))

    def checkpoint_blocks(self) -> list[nn.Module]:
        """The three convolution blocks, in order (the checkpointing knob)."""
        return [m for m in self.features if isinstance(m, nn.Sequential)]


def task() -> Task:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    images = F.interpolate(images, size=(SIDE, SIDE), mode="bilinear", align_corners=False)
    images = (images - images.mean()) / images.std()
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_val = int(len(labels) * VAL_FRACTION)
    val, train = order[:n_val], order[n_val:]
    return Task(
        model=SmallCNN,
        train=Digits(images[train], labels[train], augment=True),
        val=Digits(images[val], labels[val], augment=False),
        device_train=_device_train(images[train], labels[train]),
    )
