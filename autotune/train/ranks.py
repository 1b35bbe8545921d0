"""A run on several devices: which rank this process is, the process group it joins, and what the
training loop asks of it (the model wrapped in DistributedDataParallel, gradients synchronized
on an effective batch's last micro-batch only, rank 0's word on when to stop).

One process per device (runners/distributed.py starts them); `ALONE`, a run on one device, asks
nothing of torch.distributed, so that path is as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from autotune.search.knob import ddp_args
from autotune.train.config import TrialConfig

T = TypeVar("T")
# How long a rank waits for the others to join. A rank that never comes is the trial runner's to
# end (trial_timeout); this only keeps a rank from waiting forever with nobody watching.
JOIN_TIMEOUT = datetime.timedelta(minutes=30)


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among a run's processes: rank 0 of 1 on one device."""

    rank: int = 0
    world_size: int = 1
    # the group rank 0's decisions travel on: gloo, host to host, so that sharing one never waits
    # for a GPU's queue (None: the default group)
    control: Any = None

    @property
    def main(self) -> bool:
        """Rank 0: the one that evaluates and reports."""
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.world_size > 1

    def wrap(
        self, model: nn.Module, device: torch.device, config: TrialConfig | None = None
    ) -> nn.Module:
        """The module to train: DistributedDataParallel over several ranks, with `config`'s DDP
        knobs (None: DDP's defaults), else `model`."""
        if not self.several:
            return model
        return DistributedDataParallel(
            model,
            device_ids=[device] if device.type == "cuda" else None,
            **(ddp_args(config.as_dict()) if config is not None else {}),
        )

    def syncing(self, model: nn.Module, *, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Around a micro-batch's backward pass: gradients are averaged across ranks on the
        effective batch's last micro-batch only (DDP's no_sync on the others), as they are
        summed locally until then."""
        if self.several and not last:
            return model.no_sync()
        return contextlib.nullcontext()

    def agree(self, flag: bool) -> bool:
        """Rank 0's `flag`, on every rank."""
        if not self.several:
            return flag
        shared = torch.tensor([int(flag)], dtype=torch.int32)
        dist.broadcast(shared, src=0, group=self.control)
        return bool(shared.item())

    def from_main(self, compute: Callable[[], T]) -> T:
        """`compute()` run on rank 0 alone, its value on every rank (the others wait for it)."""
        if not self.several:
            return compute()
        value = [compute() if self.main else None]
        dist.broadcast_object_list(value, src=0, group=self.control)
        return value[0]


ALONE = Ranks()


def device_of(device: torch.device, rank: int) -> torch.device:
    """The device of `rank` in a run on `device`: on CUDA one each, counted from `device`'s index;
    on the CPU all share it."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


@contextlib.contextmanager
def joined(rank: int, world_size: int, *, port: int, device: torch.device) -> Iterator[Ranks]:
    """This process as `rank` of `world_size` in a process group on 127.0.0.1:`port` (NCCL on
    CUDA, gloo on the CPU), left again on the way out when the run ended normally; after an
    error the runner ends every rank, and leaving could wait on a peer that never comes."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=JOIN_TIMEOUT,
    )
    control = dist.new_group(backend="gloo") if cuda else None
    yield Ranks(rank=rank, world_size=world_size, control=control)
    # Every rank here before any tears its connections down: gloo aborts a rank whose last
    # messages a peer's exit cut off ("Connection reset by peer", a SIGABRT), rarely.
    dist.barrier(group=control)
    dist.destroy_process_group()
