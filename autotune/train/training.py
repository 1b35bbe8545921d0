"""One run's training objects, built fresh from its configuration: the loader, the model (in its
memory format, compiled, checkpointed, wrapped for several ranks), the optimizer, the LR
schedule and the precision, and the step that trains one effective batch with them (recipe.py's
rules). The loop that runs them is train/trial.py; the measurements of probe/rates.py and
probe/throughput.py build the same.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from autotune.search import recipe
from autotune.search.knob import PRECISIONS
from autotune.train import systems
from autotune.train.config import Limits, TrialConfig
from autotune.train.loader import DeviceLoader, training_batches
from autotune.train.ranks import ALONE, Ranks
from autotune.train.tasks import Task, takes

# autocast's
DTYPES = {name: getattr(torch, precision.dtype) for name, precision in PRECISIONS.items()}


@dataclasses.dataclass(frozen=True)
class Training:
    """What one run trains with, built fresh from its configuration."""

    loader: DataLoader | DeviceLoader
    evaluated: torch.nn.Module  # the module to evaluate: the uncompiled one, sharing its parameters
    # train_step over one effective batch
    step: Callable[[Sequence[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor]
    scheduler: Any
    autocast: Callable[[], Any]
    total_steps: int  # optimizer steps this run may take: its schedule's, cut at max_epochs


def build(
    task: Task,
    config: TrialConfig,
    *,
    limits: Limits,
    device: torch.device,
    seed: int,
    ranks: Ranks = ALONE,
) -> Training:
    """The loader, model, optimizer, LR schedule and precision of one run (recipe.py's rules); as
    one of several `ranks`, its shard of the data and its model in DistributedDataParallel."""
    loader = training_batches(task, config, seed=seed, device=device, ranks=ranks)
    params = dict(config.params)
    model, evaluated = systems.prepare_model(
        task.model(**takes(task.model, params)).to(device),
        channels_last=config.channels_last,
        compile=config.compile,
        checkpointing=config.checkpointing,
        wrap=functools.partial(ranks.wrap, device=device, config=config) if ranks.several else None,
    )
    model.train()
    # a factory without one never gets it (fit_to_device)
    fused = {"fused": True} if config.fused_optimizer else {}
    optimizer = task.optimizer(
        evaluated.parameters(), config.lr, **takes(task.optimizer, params, after=2), **fused
    )
    schedule_epochs = (
        config.schedule_epochs if config.schedule_epochs is not None else limits.max_epochs
    )
    schedule_steps = max(1, math.floor(schedule_epochs * len(loader) / config.accumulation_steps))
    total_steps = min(
        schedule_steps,
        max(1, math.floor(limits.max_epochs * len(loader) / config.accumulation_steps)),
    )
    precision = PRECISIONS[config.precision]
    scaler = torch.amp.GradScaler(device.type, enabled=precision.grad_scaler)
    autocast = functools.partial(
        torch.autocast, device.type, dtype=DTYPES[config.precision], enabled=precision.autocast
    )
    step = functools.partial(
        train_step,
        model,
        loss_fn=task.loss,
        optimizer=optimizer,
        scaler=scaler,
        autocast=autocast,
        device=device,
        non_blocking=config.pin_memory,
        channels_last=config.channels_last,
        ranks=ranks,
    )
    scheduler = make_scheduler(
        config.scheduler, optimizer, total_steps=schedule_steps, lr=config.lr
    )
    return Training(
        loader=loader,
        evaluated=evaluated,
        step=step,
        scheduler=scheduler,
        autocast=autocast,
        total_steps=total_steps,
    )


def train_step(
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    autocast: Callable[[], Any],
    device: torch.device,
    non_blocking: bool,
    channels_last: bool = False,
    ranks: Ranks = ALONE,
) -> torch.Tensor:
    """One optimizer step over the micro-batches of one effective batch; returns the effective
    batch's loss, detached and still on the device (reading it would wait for the step).

    Each micro-batch's loss is divided by their number, so with a mean-reduced loss the gradient
    equals that of one batch holding all of them; over several ranks DDP averages the ranks'
    gradients once, on the last micro-batch, so it equals that of their union.
    """
    total = None
    for index, (inputs, targets) in enumerate(micro_batches):
        inputs = systems.to_device(
            inputs, device, non_blocking=non_blocking, channels_last=channels_last
        )
        targets = targets.to(device, non_blocking=non_blocking)
        with ranks.syncing(model, last=index == len(micro_batches) - 1):
            with autocast():
                loss = loss_fn(model(inputs), targets) / len(micro_batches)
            scaler.scale(loss).backward()
        total = loss.detach() if total is None else total + loss.detach()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def make_scheduler(
    name: str, optimizer: torch.optim.Optimizer, *, total_steps: int, lr: float
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR schedule over the trial's whole step budget, stepped once per optimizer step
    (recipe.SCHEDULES)."""
    torch_class, kwargs = recipe.scheduler_args(name, total_steps=total_steps, lr=lr)
    return getattr(torch.optim.lr_scheduler, torch_class)(optimizer, **kwargs)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
