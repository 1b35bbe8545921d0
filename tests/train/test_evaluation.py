"""Evaluation reads the validation set per sample once per process, where its batches fit in
KEEP_BYTES, and gives the same metric as reading it every time."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.train import evaluation
from autotune.train.tasks import Task
from tests.tasks import blobs

CPU = torch.device("cpu")


class Counted(Dataset):
    """A validation set that counts the samples read from it."""

    def __init__(self, data: Dataset) -> None:
        self.data, self.reads = data, 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        self.reads += 1
        return self.data[index]


class ScalesItsInputInPlace(nn.Module):
    """A model that changes the batch it is given, as `nn.ReLU(inplace=True)` first would, and
    notes the sum of every batch it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        self.seen: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(float(x.sum()))
        return self.net(x.mul_(2))


class FailsOnItsSecondBatch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net, self.calls = nn.Sequential(nn.Linear(8, 4)), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("out of memory")
        return self.net(x)


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluation, "_kept", None)


def metric(task: Task, model: nn.Module) -> float:
    value, _ = evaluation.evaluate(
        model, task, device=CPU, autocast=lambda: torch.autocast("cpu", enabled=False)
    )
    return value


def counted_task(model=None) -> tuple[Task, Counted]:
    task = blobs()
    val = Counted(task.val)
    return Task(model=model or task.model, train=task.train, val=val), val


def test_the_second_evaluation_reads_no_sample_and_gives_the_same_metric() -> None:
    task, val = counted_task()
    model = task.model()
    first = metric(task, model)
    assert val.reads == len(val)
    assert [metric(task, model) for _ in range(3)] == [first] * 3
    assert val.reads == len(val)  # kept, not read again


def test_a_set_too_large_to_keep_is_read_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    task, val = counted_task()
    # one batch of 256 samples of 8 float32 inputs and an int64 label: 10,240 bytes
    monkeypatch.setattr(evaluation, "KEEP_BYTES", 10_240 * 2 - 1)
    model = task.model()
    values = [metric(task, model) for _ in range(2)]
    assert val.reads == 2 * len(val) and values[0] == values[1]


def test_another_validation_set_is_read_and_the_one_before_let_go() -> None:
    task, val = counted_task()
    model = task.model()
    metric(task, model)
    other, other_val = counted_task()
    metric(other, model)
    assert other_val.reads == len(other_val)
    assert evaluation._kept is not None and evaluation._kept[0] is other_val
    metric(task, model)  # the first again: read again, only the last set is kept
    assert val.reads == 2 * len(val)


def test_a_model_that_changes_its_input_in_place_leaves_the_kept_batches_alone() -> None:
    task, val = counted_task(ScalesItsInputInPlace)
    model = task.model()
    for _ in range(3):
        metric(task, model)
    batches = len(model.seen) // 3
    assert model.seen == model.seen[:batches] * 3 and val.reads == len(val)


def test_an_evaluation_cut_short_keeps_nothing() -> None:
    task, val = counted_task()
    with pytest.raises(RuntimeError, match="out of memory"):
        metric(task, FailsOnItsSecondBatch())
    assert evaluation._kept is None
    read_before = val.reads
    metric(task, task.model())
    assert val.reads == read_before + len(val)
