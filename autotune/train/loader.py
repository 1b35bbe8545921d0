"""The DataLoader as a trial builds and feeds it (recipe.loader_kwargs), and how its workers
stop."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from autotune import signals
from autotune.search import recipe
from autotune.train.config import TrialConfig
from autotune.train.distributed import ALONE, Ranks

# torch warns, when a loader is built and again when it starts, that it has more workers than the
# process has cores. The space allows up to 4 a core (a worker waiting on storage or decoding
# leaves its core to another) and the study measures whether they pay: in a study the warning
# would repeat, twice, in every trial that tries them.
MORE_WORKERS_THAN_CORES = r"This DataLoader will create \d+ worker processes in total"


def make_loader(
    dataset: Any, config: TrialConfig, *, seed: int, device: torch.device, ranks: Ranks = ALONE
) -> DataLoader:
    """The trial's loader: the recipe's arguments, memory pinned only where it speeds copies
    (CUDA), the shuffle seeded by the run's seed, its batches endless (EpochBatches: one epoch's
    is `len(loader)`). A dataset that takes keys (`keyed`, tasks.augmentation_rng) gets its
    shuffle and its augmentation's keys from a KeyedSampler, so loader settings leave every batch
    as it is. Over several ranks each loads its own shard of every epoch (a DistributedSampler,
    or the KeyedSampler's shard), `batch_size` samples a micro-batch."""
    kwargs = recipe.loader_kwargs(config.as_dict())
    batch_size, drop_last, shuffle = (kwargs.pop(k) for k in ("batch_size", "drop_last", "shuffle"))
    kwargs["pin_memory"] = config.pin_memory and device.type == "cuda"
    # one generator for the shuffle and the workers' seeds, drawn in the order DataLoader draws
    generator = torch.Generator().manual_seed(seed)
    sampler: Sampler[Any]
    if getattr(dataset, "keyed", False):
        sampler = KeyedSampler(len(dataset), seed=seed, ranks=ranks)
    elif ranks.several:
        sampler = DistributedSampler(
            dataset, num_replicas=ranks.world_size, rank=ranks.rank, shuffle=shuffle, seed=seed
        )
    else:
        sampler = (
            RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        )
    with _more_workers_than_cores():
        return DataLoader(
            dataset,
            batch_sampler=EpochBatches(sampler, batch_size=batch_size, drop_last=drop_last),
            **kwargs,
            worker_init_fn=_worker_init if config.num_workers > 0 else None,
            generator=generator,
        )


class EpochBatches(Sampler[list[Any]]):
    """The micro-batches of epoch after epoch without end, each epoch's as BatchSampler makes them
    from `sampler` (told each epoch's number where it has set_epoch, as DistributedSampler does).

    One DataLoader iterator then serves a whole run, and its workers load the next epoch's first
    batches while this epoch's last ones train. A new iterator each epoch asks for them only once
    the last is taken: on an H100 the quarter epochs across an epoch's start trained at half the
    speed of the others. Each epoch is still shuffled afresh and cut into whole batches.
    `len()`: one epoch's batches."""

    def __init__(self, sampler: Sampler[Any], *, batch_size: int, drop_last: bool) -> None:
        self.batches = BatchSampler(sampler, batch_size, drop_last)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[Any]]:
        set_epoch = getattr(self.batches.sampler, "set_epoch", None)
        for epoch in itertools.count():
            if set_epoch is not None:
                set_epoch(epoch)
            yield from self.batches


class KeyedSampler(Sampler[tuple[int, int]]):
    """Each epoch, every index once in a shuffled order, each with a key its augmentation draws
    from. Both come from the run's seed in the main process: a worker's own random numbers (or
    the training's, with no workers) would make the batches depend on the loader settings.

    Over several ranks every rank draws the same order and keys and takes every world_size-th
    (the order padded from its start to a whole number each, as DistributedSampler pads): the
    ranks' k-th micro-batches together hold the samples one process's k-th effective batch
    would."""

    def __init__(self, size: int, *, seed: int, ranks: Ranks = ALONE) -> None:
        self.size, self.generator = size, torch.Generator().manual_seed(seed)
        self.rank, self.world_size = ranks.rank, ranks.world_size

    def __len__(self) -> int:
        return -(-self.size // self.world_size)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = torch.randperm(self.size, generator=self.generator).tolist()
        keys = torch.randint(0, 2**62, (self.size,), generator=self.generator).tolist()
        if self.world_size == 1:
            return zip(order, keys)
        pairs = list(zip(order, keys))
        pairs += pairs[: len(self) * self.world_size - self.size]
        return iter(pairs[self.rank :: self.world_size])


def endless(loader: DataLoader) -> Iterator[Any]:
    """The micro-batches of a make_loader loader, epoch after epoch from one iterator
    (EpochBatches), so an effective batch may span an epoch boundary. The loader's workers
    (persistent: started once) are forked with SIGINT and SIGTERM held back, and are shut down
    when the generator is closed, whatever ended the trial."""
    with signals.held(), _more_workers_than_cores():
        batches = iter(loader)
    try:
        yield from batches  # a trial's every batch passes here: nothing added to it
    finally:
        shut_down_workers(loader)


def shut_down_workers(loader: DataLoader) -> None:
    """Stop a loader's persistent workers now. The loader keeps its iterator (and so its workers)
    for as long as it lives, and a raised trial's traceback keeps the loader alive; workers that
    ignore SIGTERM would then hold up the exit of the process that made them. Lightning does the
    same with the same private attribute: torch has no public call for it."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


@contextlib.contextmanager
def _more_workers_than_cores() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MORE_WORKERS_THAN_CORES, category=UserWarning)
        yield


def _worker_init(_: int) -> None:
    torch.set_num_threads(recipe.WORKER_THREADS)
    signals.ignore_in_worker()  # the trial's process stops on a signal and shuts its workers down
