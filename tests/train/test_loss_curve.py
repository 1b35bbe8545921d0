"""The training loss beside the curve: at each evaluation, the mean of the loss the task's loss
function returned over the steps since the evaluation before, read from the device only where
the loop already waits for it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch import nn

from autotune.train.config import Limits, TrialConfig
from autotune.train.trial import FINITE_CHECK_EVERY, run
from tests.tasks import blobs

CPU = torch.device("cpu")
CONFIG = TrialConfig(
    lr=0.05,
    scheduler="constant",
    batch_size=32,
    accumulation_steps=1,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
)
NEVER = Limits(target=2.0, max_epochs=2, max_seconds=60, eval_every=0.5)  # accuracy never reaches 2


def test_each_evaluation_stores_the_mean_loss_of_the_micro_batches_since_the_one_before() -> None:
    """With two micro-batches a step, each loss is the loss function's own (not divided by the
    steps), averaged over the evaluation's interval only."""
    seen: list[float] = []

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        value = nn.functional.cross_entropy(outputs, targets)
        seen.append(value.item())
        return value

    task = dataclasses.replace(blobs(), loss=loss)
    config = dataclasses.replace(CONFIG, accumulation_steps=2)
    result = run(task, config, limits=NEVER, device=CPU, seed=0)
    assert result.train_loss is not None and len(result.train_loss) == len(result.curve) == 4
    ends = [round(epochs * len(task.train) / config.batch_size) for _, epochs, _ in result.curve]
    expected = [
        sum(seen[start:end]) / (end - start) for start, end in zip([0, *ends], ends, strict=False)
    ]
    assert ends[-1] == len(seen)
    assert list(result.train_loss) == pytest.approx(expected, rel=1e-5)


class Counted(torch.Tensor):
    """A loss that counts the reads of itself and of every tensor made from it: each waits for the
    device on a GPU."""

    reads = 0
    READS = frozenset({"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "cpu"})

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if getattr(func, "__name__", None) in cls.READS:
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_the_loss_is_read_only_at_the_finite_checks_and_the_evaluations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per evaluation, the finite check and the mean; between them, every FINITE_CHECK_EVERY steps
    the finite check alone: never a read per step."""
    monkeypatch.setattr(Counted, "reads", 0)

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets).as_subclass(Counted)

    result = run(dataclasses.replace(blobs(), loss=loss), CONFIG, limits=NEVER, device=CPU, seed=0)
    steps, evaluations = result.optimizer_steps, len(result.curve)
    assert steps == 64 and evaluations == 4
    checks = steps // FINITE_CHECK_EVERY
    # at least one read per evaluation: the count sees the loss's tensors
    assert checks + evaluations <= Counted.reads <= checks + 2 * evaluations < steps
    assert all(math.isfinite(value) for value in result.train_loss)
