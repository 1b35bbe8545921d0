"""The DataLoader as a trial builds and feeds it (recipe.loader_kwargs), and how its workers
stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from autotune import signals
from autotune.search import recipe
from autotune.train.config import TrialConfig
from autotune.train.distributed import ALONE, Ranks


def make_loader(
    dataset: Any, config: TrialConfig, *, seed: int, device: torch.device, ranks: Ranks = ALONE
) -> DataLoader:
    """The trial's loader: the recipe's arguments, memory pinned only where it speeds copies
    (CUDA), the shuffle seeded by the run's seed. A dataset that takes keys (`keyed`,
    tasks.augmentation_rng) gets its shuffle and its augmentation's keys from a KeyedSampler, so
    loader settings leave every batch as it is. Over several ranks each loads its own shard of
    every epoch (a DistributedSampler, or the KeyedSampler's shard), `batch_size` samples a
    micro-batch."""
    kwargs = recipe.loader_kwargs(config.as_dict())
    kwargs["pin_memory"] = config.pin_memory and device.type == "cuda"
    if getattr(dataset, "keyed", False):
        sampler: Sampler[Any] = KeyedSampler(len(dataset), seed=seed, ranks=ranks)
        kwargs.update(shuffle=False, sampler=sampler)
    elif ranks.several:
        sampler = DistributedSampler(
            dataset, num_replicas=ranks.world_size, rank=ranks.rank, shuffle=True, seed=seed
        )
        kwargs.update(shuffle=False, sampler=sampler)
    return DataLoader(
        dataset,
        **kwargs,
        worker_init_fn=_worker_init if config.num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


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


def endless(loader: DataLoader, *, epoch_starts: bool = False) -> Iterator[Any]:
    """Micro-batches epoch after epoch, so an effective batch may span an epoch boundary; with
    `epoch_starts`, each as (whether it is its epoch's first, the batch). The loader's workers
    (persistent: started once) are forked with SIGINT and SIGTERM held back, and are shut down
    when the generator is closed, whatever ended the trial. A DistributedSampler is told each
    epoch's number, which its shuffle is seeded by."""
    set_epoch = getattr(loader.sampler, "set_epoch", None)
    epoch = 0
    with signals.held():
        batches = iter(loader)
    try:
        while True:
            if epoch_starts:
                yield from ((index == 0, batch) for index, batch in enumerate(batches))
            else:
                yield from batches  # a trial's every batch passes here: nothing added to it
            epoch += 1
            if set_epoch is not None:
                set_epoch(epoch)
            batches = iter(loader)
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


def _worker_init(_: int) -> None:
    torch.set_num_threads(recipe.WORKER_THREADS)
    signals.ignore_in_worker()  # the trial's process stops on a signal and shuts its workers down
