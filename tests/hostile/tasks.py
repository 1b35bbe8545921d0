"""Tasks that are broken on purpose, each in one way, for tests/test_hostile_round.py.

Small (the blobs data of tests/tasks.py), so a study of them trains in well under a second.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from autotune import Task
from tests.tasks import _blobs, _mlp

STARTED = (
    "AUTOTUNE_HOSTILE_STARTED"  # env: a file the slow task creates when a trial starts training
)


def returns_none():
    return None


def returns_a_dict():
    return {"model": _mlp, "train": _blobs(256, 0), "val": _blobs(128, 1)}


NOT_CALLABLE = 5  # named as a task: `tests.hostile.tasks:NOT_CALLABLE`


def needs_an_argument(data_folder):
    return Task(model=_mlp, train=_blobs(256, 0), val=_blobs(128, 1))


def _load_weights() -> nn.Module:
    raise FileNotFoundError("weights.pt is missing")  # the line a failed trial's reason must name


def model_raises() -> Task:
    return Task(model=_load_weights, train=_blobs(256, 0), val=_blobs(128, 1))


def no_parameters() -> Task:
    """A model with nothing to train: the optimizer gets an empty parameter list."""
    return Task(model=nn.Identity, train=_blobs(256, 0), val=_blobs(128, 1))


def model_is_a_function() -> Task:
    """The factory returns a plain function, not an nn.Module."""
    return Task(
        model=lambda: lambda x: x @ torch.ones(8, 4), train=_blobs(256, 0), val=_blobs(128, 1)
    )


class _Broken(TensorDataset):
    def __getitem__(self, index: int):
        raise KeyError(f"no sample {index} in the index file")


def every_item_raises() -> Task:
    data = _blobs(256, 0)
    return Task(model=_mlp, train=_Broken(*data.tensors), val=_blobs(128, 1))


def wrong_input_shape() -> Task:
    """Inputs of 5 features for a model that takes 8."""
    g = torch.Generator().manual_seed(0)
    return Task(
        model=_mlp,
        train=TensorDataset(
            torch.randn(256, 5, generator=g), torch.randint(0, 4, (256,), generator=g)
        ),
        val=TensorDataset(
            torch.randn(128, 5, generator=g), torch.randint(0, 4, (128,), generator=g)
        ),
    )


def labels_out_of_range() -> Task:
    """Labels 0..9 for a model with 4 outputs."""
    data = _blobs(256, 0)
    return Task(
        model=_mlp, train=TensorDataset(data.tensors[0], data.tensors[1] + 6), val=_blobs(128, 1)
    )


def empty_training_set() -> Task:
    return Task(model=_mlp, train=_blobs(0, 0), val=_blobs(128, 1))


class _NaN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * float("nan")


def outputs_nan() -> Task:
    return Task(model=_NaN, train=_blobs(256, 0), val=_blobs(128, 1))


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(_blobs(256, 0))


def iterable_training_set() -> Task:
    """An IterableDataset: no length, no indexing."""
    return Task(model=_mlp, train=_Stream(), val=_blobs(128, 1))


def no_validation_set() -> Task:
    return Task(model=_mlp, train=_blobs(256, 0), val=None)


def metric_returns_text() -> Task:
    return Task(
        model=_mlp, train=_blobs(256, 0), val=_blobs(128, 1), metric=lambda outputs, targets: "high"
    )


def loss_not_scalar() -> Task:
    return Task(
        model=_mlp,
        train=_blobs(256, 0),
        val=_blobs(128, 1),
        loss=lambda outputs, targets: nn.functional.cross_entropy(
            outputs, targets, reduction="none"
        ),
    )


def optimizer_returns_none() -> Task:
    return Task(
        model=_mlp, train=_blobs(256, 0), val=_blobs(128, 1), optimizer=lambda params, lr: None
    )


def _chatty() -> nn.Module:
    sys.stdout.write(("x" * 1023 + "\n") * 2048)  # 2 MiB on stdout, every model built
    sys.stdout.flush()
    return _mlp()


def prints_megabytes() -> Task:
    return Task(model=_chatty, train=_blobs(256, 0), val=_blobs(128, 1))


class _Slow(nn.Module):
    """The blobs MLP at 20 ms a training step; notes that a trial (or a confirmation run,
    `.confirm`) began training in the file $AUTOTUNE_HOSTILE_STARTED names."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            marker = os.environ.get(STARTED)
            if marker:  # the confirmation's fresh seeds are x50,000 and up (study/confirm.py)
                Path(
                    marker + (".confirm" if torch.initial_seed() % 100_000 >= 50_000 else "")
                ).touch()
            time.sleep(0.02)
        return self.net(x)


def slow() -> Task:
    return Task(model=_Slow, train=_blobs(1024, 0), val=_blobs(256, 1))


class _Raises(nn.Module):
    """The blobs MLP whose first training step raises what `error()` gives: user code's own
    exception, with no signal sent."""

    error: staticmethod

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise self.error()
        return self.net(x)


class _Interrupts(_Raises):
    error = staticmethod(lambda: KeyboardInterrupt("raised by the model, no signal sent"))


class QuotaExceeded(BaseException):  # noqa: N818 - a user's name, not ours
    """A library's own BaseException subclass (as some job schedulers' clients define)."""


class _Quota(_Raises):
    error = staticmethod(lambda: QuotaExceeded("GPU-hour quota exceeded"))


def raises_keyboard_interrupt() -> Task:
    return Task(model=_Interrupts, train=_blobs(256, 0), val=_blobs(128, 1))


def raises_a_base_exception() -> Task:
    return Task(model=_Quota, train=_blobs(256, 0), val=_blobs(128, 1))


def _exits() -> nn.Module:
    sys.exit(3)


def model_factory_exits() -> Task:
    """`sys.exit(3)` in the model factory, which autotune also calls before any trial (to see
    whether the model takes channels_last)."""
    return Task(model=_exits, train=_blobs(256, 0), val=_blobs(128, 1))


class _Sized(TensorDataset):
    """The blobs set, whose __len__ says `length` (whatever it is)."""

    length: object = 256

    def __len__(self):  # noqa: D105 - returns what the case needs, even what len() refuses
        return self.length


def _sized(length: object) -> Task:
    data = _blobs(256, 0)
    sized = type("Sized", (_Sized,), {"length": length})(*data.tensors)
    return Task(model=_mlp, train=sized, val=_blobs(128, 1))


def length_negative() -> Task:
    return _sized(-1)


def length_fractional() -> Task:
    return _sized(1024.5)


def length_a_trillion() -> Task:
    """A set whose __len__ says 10^12: its epoch's shuffle alone would take 8 TB."""
    return _sized(10**12)


class _Unlabelled(TensorDataset):
    """Each sample its input alone, as an autoencoder's data might be written."""

    def __getitem__(self, index: int):
        return self.tensors[0][index]


def samples_without_targets() -> Task:
    data = _blobs(256, 0)
    return Task(model=_mlp, train=_Unlabelled(*data.tensors), val=_blobs(128, 1))


def samples_as_triples() -> Task:
    data = _blobs(256, 0)
    extra = torch.zeros(256)
    return Task(model=_mlp, train=TensorDataset(*data.tensors, extra), val=_blobs(128, 1))


def device_train_returns_none() -> Task:
    return Task(
        model=_mlp, train=_blobs(256, 0), val=_blobs(128, 1), device_train=lambda device: None
    )


SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _detaches_a_helper() -> nn.Module:
    """A model factory that starts a helper in a session of its own (a log shipper, a data
    server), holding this process's output open, and one more through a double fork, whose
    parent is gone at once: neither is in the trial's process group."""
    import subprocess

    subprocess.Popen(SLEEPER, start_new_session=True)
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import subprocess; subprocess.Popen({SLEEPER!r}, start_new_session=True)",
        ],
        check=True,
    )
    return _mlp()


def detaches_a_helper() -> Task:
    return Task(model=_detaches_a_helper, train=_blobs(256, 0), val=_blobs(128, 1))
