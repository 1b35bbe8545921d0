"""The DataLoader as a trial builds and feeds it (recipe.loader_kwargs), and how its workers
stop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from autotune import signals
from autotune.search import recipe
from autotune.train.config import TrialConfig


def make_loader(
    dataset: Any, config: TrialConfig, *, seed: int, device: torch.device
) -> DataLoader:
    """The trial's loader: the recipe's arguments, memory pinned only where it speeds copies
    (CUDA), the shuffle seeded by the run's seed. A dataset that takes keys (`keyed`,
    tasks.augmentation_rng) gets its shuffle and its augmentation's keys from a KeyedSampler, so
    loader settings leave every batch as it is."""
    kwargs = recipe.loader_kwargs(config.as_dict())
    kwargs["pin_memory"] = config.pin_memory and device.type == "cuda"
    if getattr(dataset, "keyed", False):
        kwargs.update(shuffle=False, sampler=KeyedSampler(len(dataset), seed=seed))
    return DataLoader(
        dataset,
        **kwargs,
        worker_init_fn=_worker_init if config.num_workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


class KeyedSampler(Sampler[tuple[int, int]]):
    """Each epoch, every index once in a shuffled order, each with a key its augmentation draws
    from. Both come from the run's seed in the main process: a worker's own random numbers (or
    the training's, with no workers) would make the batches depend on the loader settings."""

    def __init__(self, size: int, *, seed: int) -> None:
        self.size, self.generator = size, torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = torch.randperm(self.size, generator=self.generator).tolist()
        keys = torch.randint(0, 2**62, (self.size,), generator=self.generator).tolist()
        return zip(order, keys)


def endless(loader: DataLoader, *, epoch_starts: bool = False) -> Iterator[Any]:
    """Micro-batches epoch after epoch, so an effective batch may span an epoch boundary; with
    `epoch_starts`, each as (whether it is its epoch's first, the batch). The loader's workers
    (persistent: started once) are forked with SIGINT and SIGTERM held back, and are shut down
    when the generator is closed, whatever ended the trial."""
    with signals.held():
        batches = iter(loader)
    try:
        while True:
            if epoch_starts:
                yield from ((index == 0, batch) for index, batch in enumerate(batches))
            else:
                yield from batches  # a trial's every batch passes here: nothing added to it
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
