"""The trial's loader: one iterator serves every epoch (EpochBatches), with the batches a new
iterator each epoch would give, and its workers load across an epoch's end."""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import re
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from autotune.train.config import TrialConfig
from autotune.train.loader import MORE_WORKERS_THAN_CORES, KeyedSampler, endless, make_loader

CPU = torch.device("cpu")
CONFIG = TrialConfig(
    lr=0.1,
    scheduler="constant",
    batch_size=3,
    accumulation_steps=1,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
)
SIZE = 10  # 3 batches of 3 an epoch, one sample dropped


class Numbers(Dataset):
    """Each sample its index; keyed, its index and its augmentation's key (KeyedSampler)."""

    def __init__(self, *, keyed: bool = False) -> None:
        self.keyed = keyed

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, item):
        return torch.tensor(item)


def epochs_of(loader: DataLoader, count: int) -> list[list[list[int]]]:
    """`count` epochs of batches, each batch as a list."""
    batches = [b.tolist() for b in itertools.islice(endless(loader), count * len(loader))]
    return [batches[e * len(loader) : (e + 1) * len(loader)] for e in range(count)]


@pytest.mark.parametrize("keyed", [False, True])
def test_one_iterator_gives_every_epoch_what_a_new_iterator_each_epoch_gives(keyed: bool) -> None:
    """With workers, the shuffle and its seed are those of a plain DataLoader of the same
    arguments (a keyed dataset: of its KeyedSampler) iterated afresh each epoch: the same batches,
    in the same order, each epoch a new order of whole batches."""
    config = dataclasses.replace(CONFIG, num_workers=2, prefetch_factor=2)
    loader = make_loader(Numbers(keyed=keyed), config, seed=7, device=CPU)
    assert len(loader) == SIZE // 3
    ours = epochs_of(loader, 3)

    sampling = (
        {"sampler": KeyedSampler(SIZE, seed=7)} if keyed else {"shuffle": True}
    )  # as a trial's loader did before its batches ran on
    plain = DataLoader(
        Numbers(keyed=keyed),
        batch_size=3,
        drop_last=True,
        num_workers=2,
        prefetch_factor=2,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(7),
        **sampling,
    )
    expected = [[b.tolist() for b in plain] for _ in range(3)]
    assert ours == expected
    for epoch in ours:
        seen = [s[0] if keyed else s for batch in epoch for s in batch]  # (index, key) if keyed
        assert len(seen) == len(set(seen)) == 9  # every sample at most once, the last dropped
    assert ours[0] != ours[1] != ours[2]  # shuffled afresh


def test_the_batches_do_not_depend_on_the_loader_settings() -> None:
    """Without workers the loader draws its shuffle as with them: a trial's maths is the same
    whatever its loader settings (for a keyed dataset, its augmentation too)."""
    in_main = epochs_of(make_loader(Numbers(), CONFIG, seed=3, device=CPU), 3)
    workers = dataclasses.replace(CONFIG, num_workers=2, prefetch_factor=4)
    assert epochs_of(make_loader(Numbers(), workers, seed=3, device=CPU), 3) == in_main
    assert epochs_of(make_loader(Numbers(), CONFIG, seed=4, device=CPU), 3) != in_main


class Counted(Dataset):
    """Counts the samples loaded, in whichever process loads them."""

    def __init__(self) -> None:
        self.loaded = multiprocessing.Value("i", 0)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        with self.loaded.get_lock():
            self.loaded.value += 1
        return torch.tensor(index)


def test_workers_load_the_next_epoch_before_this_epochs_last_batch_is_trained() -> None:
    """Once an epoch's last batch is taken, the workers go on to the next epoch's first batches
    (prefetch_factor of them a worker) without being asked: a new iterator each epoch would leave
    them idle until the next epoch's first batch is asked for."""
    data = Counted()
    config = dataclasses.replace(CONFIG, num_workers=1, prefetch_factor=2)
    loader = make_loader(data, config, seed=0, device=CPU)
    batches = endless(loader)
    try:
        for _ in range(len(loader)):  # the whole first epoch, 9 samples in 3 batches
            next(batches)
        deadline = time.monotonic() + 30
        while data.loaded.value < 9 + 2 * 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert data.loaded.value == 9 + 2 * 3  # the next epoch's first 2 batches, and no more
    finally:
        batches.close()


def test_more_workers_than_cores_are_tried_without_torchs_warning() -> None:
    """The space allows up to 4 workers a core and the study measures whether they pay: torch's
    warning would repeat in every trial that tries them. A plain DataLoader still warns."""
    workers = len(os.sched_getaffinity(0)) + 1
    config = dataclasses.replace(CONFIG, num_workers=workers, prefetch_factor=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        DataLoader(Numbers(), num_workers=workers)
        assert any(re.match(MORE_WORKERS_THAN_CORES, str(w.message)) for w in seen)
        seen.clear()
        batches = endless(make_loader(Numbers(), config, seed=0, device=CPU))
        assert len(next(batches)) == 3
        batches.close()
    assert not [str(w.message) for w in seen if "worker" in str(w.message)]
