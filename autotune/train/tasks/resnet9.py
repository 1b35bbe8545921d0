"""The ResNet-9 of DAWNBench (myrtle.ai) and airbench, the shapes task's model."""

from __future__ import annotations

import torch
from torch import nn

from autotune.train.tasks.shape_drawing import CLASSES


def _conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_conv(channels, channels), _conv(channels, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class ResNet9(nn.Module):
    """The ResNet-9 of DAWNBench (myrtle.ai) and airbench: w, 2w, 4w, 8w channels at 32, 16, 8, 4
    pixels."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            _conv(3, w),
            _conv(w, 2 * w),
            nn.MaxPool2d(2),
            Residual(2 * w),
            _conv(2 * w, 4 * w),
            nn.MaxPool2d(2),
            _conv(4 * w, 8 * w),
            nn.MaxPool2d(2),
            Residual(8 * w),
            nn.AdaptiveMaxPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(8 * w, len(CLASSES), bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)) * 0.125  # myrtle.ai's scaling: small logits at the start

    def checkpoint_blocks(self) -> list[nn.Module]:
        """The convolution and residual blocks, in order (the checkpointing knob)."""
        return [m for m in self.features if isinstance(m, (nn.Sequential, Residual))]
