"""A trial's training batches: the DataLoader as a trial builds and feeds it
(recipe.loader_kwargs) and how its workers stop, or the same batches gathered on the device from a
copy of the training set kept there (the data_on_device knob)."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    TensorDataset,
)

from autotune import signals
from autotune.search import recipe
from autotune.search.devices import FITS_SHARE
from autotune.train.config import TrialConfig
from autotune.train.ranks import ALONE, Ranks
from autotune.train.tasks import Task

# torch warns, when a loader is built and again when it starts, that it has more workers than the
# process has cores. The space allows up to 4 a core (a worker waiting on storage or decoding
# leaves its core to another) and the study measures whether they pay: in a study the warning
# would repeat, twice, in every trial that tries them.
MORE_WORKERS_THAN_CORES = r"This DataLoader will create \d+ worker processes in total"


def training_batches(
    task: Task, config: TrialConfig, *, seed: int, device: torch.device, ranks: Ranks = ALONE
) -> DataLoader | DeviceLoader:
    """A run's training batches: its DataLoader (`make_loader`), or with `data_on_device` the
    same batches gathered on the device by the task (DeviceLoader)."""
    if not config.data_on_device:
        return make_loader(task.train, config, seed=seed, device=device, ranks=ranks)
    gather = gather_on(task, device)
    if gather is None:
        raise ValueError("data_on_device: the task keeps no training set on the device")
    batches, generator = _batches(task.train, config, seed=seed, ranks=ranks)
    source = "device_train" if task.device_train is not None else "training set"
    return DeviceLoader(batches, gather, generator=generator, source=source)


def make_loader(
    dataset: Any, config: TrialConfig, *, seed: int, device: torch.device, ranks: Ranks = ALONE
) -> DataLoader:
    """The trial's DataLoader: the recipe's arguments, memory pinned only where it speeds copies
    (CUDA), the shuffle seeded by the run's seed, its batches endless (EpochBatches: one epoch's
    is `len(loader)`). A dataset that takes keys (`keyed`, tasks.augmentation_rng) gets its
    shuffle and its augmentation's keys from a KeyedSampler, so loader settings leave every batch
    as it is. Over several ranks each loads its own shard of every epoch (a DistributedSampler,
    or the KeyedSampler's shard), `batch_size` samples a micro-batch."""
    kwargs = recipe.loader_kwargs(config.as_dict())
    for fixed in ("batch_size", "drop_last", "shuffle"):
        kwargs.pop(fixed)
    kwargs["pin_memory"] = config.pin_memory and device.type == "cuda"
    batches, generator = _batches(dataset, config, seed=seed, ranks=ranks)
    with _more_workers_than_cores():
        return DataLoader(
            dataset,
            batch_sampler=batches,
            **kwargs,
            worker_init_fn=_worker_init if config.num_workers > 0 else None,
            generator=generator,
        )


def _batches(
    dataset: Any, config: TrialConfig, *, seed: int, ranks: Ranks
) -> tuple[EpochBatches, torch.Generator]:
    """A run's micro-batches of sample indices (or (index, key) pairs), epoch after epoch, and the
    generator of their shuffle, which a DataLoader also draws its workers' seeds from."""
    kwargs = recipe.loader_kwargs(config.as_dict())
    batch_size, drop_last, shuffle = (kwargs[k] for k in ("batch_size", "drop_last", "shuffle"))
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
    return EpochBatches(sampler, batch_size=batch_size, drop_last=drop_last), generator


# (indices, keys or None) -> the batch of those samples on the device (Task.device_train)
Gather = Callable[[torch.Tensor, "torch.Tensor | None"], Any]


def gather_on(task: Task, device: torch.device) -> Gather | None:
    """The function that batches the task's training samples on `device` from a copy of them kept
    there: the task's own (Task.device_train), or for a TensorDataset its tensors indexed there.
    None where the task keeps none (`keeps_on_device`)."""
    if task.device_train is not None:
        gather = task.device_train(device)
        if not callable(gather):
            raise TypeError(
                f"the task's device_train(device) returned {type(gather).__name__}, not a "
                f"function: it must return the function of (indices, keys) that gives a batch "
                f"on the device"
            )
        return gather
    if _plain_tensors(task.train):
        tensors = [t.to(device) for t in task.train.tensors]

        def gather(indices: torch.Tensor, keys: torch.Tensor | None) -> list[torch.Tensor]:
            indices = indices.to(device)  # once, for every tensor
            return [t[indices] for t in tensors]

        return gather
    return None


def keeps_on_device(task: Task) -> bool:
    """Whether the task can keep its training set on the device (the data_on_device knob)."""
    return task.device_train is not None or _plain_tensors(task.train)


NOT_ON_DEVICE = (
    "the task keeps no training set on the device (Task.device_train, or a TensorDataset)"
)


def on_device_problem(task: Task, device_bytes: int | None) -> str | None:
    """Why the task's training set cannot be kept on a device of `device_bytes` memory: it keeps
    none there, or its copy (a TensorDataset's, whose size is known before it is made) would take
    more than the share of the memory a training run may count on (FITS_SHARE), leaving
    the step none. None where it can, or where either size is unknown."""
    if not keeps_on_device(task):
        return NOT_ON_DEVICE
    if task.device_train is not None or not device_bytes:
        return None
    size = sum(t.numel() * t.element_size() for t in task.train.tensors)
    if size <= FITS_SHARE * device_bytes:
        return None
    return (
        f"the training set's tensors ({_size(size)}) would take more than "
        f"{FITS_SHARE:.0%} of the device's {_size(device_bytes)}"
    )


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.2f} MiB"


def _plain_tensors(dataset: Any) -> bool:
    """A TensorDataset whose items are its tensors' rows: one that makes its own in `__getitem__`
    (augments them, say) would not be given the same samples by indexing the tensors."""
    return isinstance(dataset, TensorDataset) and (
        type(dataset).__getitem__ is TensorDataset.__getitem__
    )


class DeviceLoader:
    """A DataLoader's batches without one: the same micro-batches of the same samples
    (`_batches`, the generator drawn as a DataLoader draws it), each gathered on the device in one
    call of the task's `gather` rather than loaded sample by sample and copied there. `len()`: one
    epoch's batches; iterated, endless, as make_loader's DataLoader is."""

    def __init__(
        self,
        batches: EpochBatches,
        gather: Gather,
        *,
        generator: torch.Generator,
        source: str = "training set",
    ) -> None:
        self.batches, self.gather, self.generator = batches, gather, generator
        self.source = source  # what gathers its batches, for an error about them

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        # A DataLoader's iterator draws its workers' base seed first, then the first shuffle.
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        keyed = isinstance(self.batches.batches.sampler, KeyedSampler)
        for batch in self.batches:
            if keyed:
                indices, keys = torch.tensor(batch, dtype=torch.int64).unbind(1)
                yield self.gather(indices, keys)
            else:
                yield self.gather(torch.tensor(batch, dtype=torch.int64), None)


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


def endless(loader: DataLoader | DeviceLoader) -> Iterator[Any]:
    """The micro-batches of a training_batches loader, epoch after epoch from one iterator
    (EpochBatches), so an effective batch may span an epoch boundary. The loader's workers
    (persistent: started once) are forked with SIGINT and SIGTERM held back, and are shut down
    when the generator is closed, whatever ended the trial."""
    with signals.held(), _more_workers_than_cores():
        batches = iter(loader)
    try:
        yield from batches  # a trial's every batch passes here: nothing added to it
    finally:
        shut_down_workers(loader)


def training_pairs(loader: DataLoader | DeviceLoader) -> Iterator[Any]:
    """`endless(loader)`, whose first batch is checked to be an (inputs, targets) pair (`pair`);
    every later one passes as it is."""
    batches = endless(loader)
    try:
        for first in batches:
            yield pair(first, getattr(loader, "source", "training set"))
            break
        yield from batches
    finally:
        batches.close()  # its workers shut down now, not when it is collected


def pair(batch: Any, where: str) -> Any:
    """`batch`, where it is an (inputs, targets) pair; else the error that says what the task's
    `where` ("training set", "validation set", "device_train") gave instead."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch
    if isinstance(batch, torch.Tensor):
        given = f"one tensor of shape {list(batch.shape)}"
    elif isinstance(batch, (tuple, list)):
        given = f"a {type(batch).__name__} of {len(batch)} items"
    elif isinstance(batch, dict):
        given = f"a dict with keys {', '.join(map(str, list(batch)[:8]))}"
    else:
        given = f"a {type(batch).__name__}"
    what = "gathers" if where == "device_train" else "gives"
    raise TypeError(
        f"the task's {where} {what} {given} for a batch; autotune trains on (input, target) "
        f"pairs, each sample as TensorDataset(inputs, targets) gives it"
    )


def shut_down_workers(loader: DataLoader | DeviceLoader) -> None:
    """Stop a loader's persistent workers now. The loader keeps its iterator (and so its workers)
    for as long as it lives, and a raised trial's traceback keeps the loader alive; workers that
    ignore SIGTERM would then hold up the exit of the process that made them. Lightning does the
    same with the same private attribute: torch has no public call for it."""
    if not isinstance(loader, DataLoader):
        return  # a DeviceLoader has no workers
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
