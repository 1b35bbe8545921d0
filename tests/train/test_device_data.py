"""data_on_device: the training set kept on the device and batched there gives the DataLoader's
batches, sample for sample, and so the same training; a task that keeps none there cannot."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from autotune.train.config import Limits, TrialConfig
from autotune.train.loader import DeviceLoader, endless, keeps_on_device, training_batches
from autotune.train.ranks import Ranks
from autotune.train.tasks import Task, load_task
from autotune.train.tasks import shapes as shapes_task
from autotune.train.trial import run
from tests.tasks import blobs

CPU = torch.device("cpu")
LOADER = TrialConfig(
    lr=0.05,
    scheduler="constant",
    batch_size=64,
    accumulation_steps=1,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
)
ON_DEVICE = dataclasses.replace(LOADER, data_on_device=True)


def batches(task: Task, config: TrialConfig, count: int, **kwargs) -> list:
    return list(itertools.islice(endless(training_batches(task, config, **kwargs)), count))


def assert_same(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for (inputs, targets), (their_inputs, their_targets) in zip(ours, theirs):
        assert torch.equal(targets, their_targets)
        torch.testing.assert_close(inputs, their_inputs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["digits", "shapes_small", "tensors"])
def test_batches_on_the_device_are_the_loaders_sample_for_sample_across_epochs(name: str) -> None:
    """Keyed tasks (digits' affine, shapes' crops and flips drawn from each sample's key) and a
    TensorDataset (no augmentation): the same samples, augmented alike, in the same order, over
    more than one epoch, whatever the loader's workers."""
    task = {
        "digits": lambda: load_task("digits"),
        "shapes_small": shapes_task.small,
        "tensors": blobs,
    }[name]()
    assert keeps_on_device(task)
    loader = training_batches(task, LOADER, seed=5, device=CPU)
    on_device = training_batches(task, ON_DEVICE, seed=5, device=CPU)
    assert isinstance(on_device, DeviceLoader) and len(on_device) == len(loader)
    count = len(loader) + 3  # into the second epoch, shuffled afresh
    expected = batches(task, LOADER, count, seed=5, device=CPU)
    assert_same(batches(task, ON_DEVICE, count, seed=5, device=CPU), expected)
    workers = dataclasses.replace(LOADER, num_workers=2, prefetch_factor=2)
    assert_same(batches(task, workers, count, seed=5, device=CPU), expected)
    other_seed = batches(task, ON_DEVICE, 1, seed=6, device=CPU)[0][0]
    assert not torch.equal(other_seed, expected[0][0])


def test_each_rank_gathers_its_own_shard_as_its_loader_does() -> None:
    for task in (load_task("digits"), blobs()):
        for rank in range(2):
            ranks = Ranks(rank, 2)
            expected = batches(task, LOADER, 6, seed=2, device=CPU, ranks=ranks)
            assert_same(batches(task, ON_DEVICE, 6, seed=2, device=CPU, ranks=ranks), expected)


def test_a_trial_with_its_data_on_the_device_trains_exactly_as_with_a_loader() -> None:
    """The knob changes where batches are made, not what a step computes: the same curve."""
    limits = Limits(target=2.0, max_epochs=1.5, max_seconds=60, eval_every=0.5)
    task = load_task("digits")
    with_loader = run(task, LOADER, limits=limits, device=CPU, seed=3)
    on_device = run(task, ON_DEVICE, limits=limits, device=CPU, seed=3)
    assert on_device.optimizer_steps == with_loader.optimizer_steps > 0
    assert [m for *_, m in on_device.curve] == [m for *_, m in with_loader.curve]
    assert on_device.train_loss == pytest.approx(with_loader.train_loss, rel=1e-6)


def test_a_task_that_keeps_no_training_set_on_the_device_is_refused() -> None:
    digits = load_task("digits")
    plain = dataclasses.replace(digits, device_train=None)  # a Dataset of its own, no hook
    assert not keeps_on_device(plain)
    with pytest.raises(ValueError, match="keeps no training set on the device"):
        training_batches(plain, ON_DEVICE, seed=0, device=CPU)
    tensors = TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    assert keeps_on_device(dataclasses.replace(digits, train=tensors, device_train=None))

    class Shifted(TensorDataset):  # makes its own items: indexing the tensors would skip that
        def __getitem__(self, index):
            inputs, targets = super().__getitem__(index)
            return inputs + 1, targets

    shifted = Shifted(*tensors.tensors)
    assert not keeps_on_device(dataclasses.replace(digits, train=shifted, device_train=None))


def test_the_shapes_task_decodes_its_training_images_once_and_reads_them_back(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decoded copy is cached beside the PNGs; a damaged cache file is decoded again."""
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path))
    shapes_task.train_pixels.cache_clear()
    train = shapes_task.datasets(200, 100)[0]
    try:
        pixels = shapes_task.train_pixels(200, 100)
        assert pixels.shape == (200, 32, 32, 3) and pixels.dtype.name == "uint8"
        assert (pixels[7] == train.images.image(7)).all()
        (cached,) = tmp_path.glob("*-train-pixels.npy")
        shapes_task.train_pixels.cache_clear()
        cached.write_bytes(cached.read_bytes()[:1000])  # cut short
        again = shapes_task.train_pixels(200, 100)
        assert (again == pixels).all() and cached.stat().st_size > 1000
    finally:
        shapes_task.train_pixels.cache_clear()
        shapes_task.datasets.cache_clear()
