"""Run one configuration: build the loader, model and optimizer, train, evaluate, time.

A trial is a function of its configuration. It never sees Optuna; exceptions (an OOM among
them) propagate to the caller, which classifies them.

Time to target: the clock starts before the DataLoader is built, runs through every
training step, pauses for each evaluation, and stops at the first evaluation whose metric reaches
the target. CUDA work is synchronized before the clock is read for a measurement.

On several devices every rank runs this loop (train/distributed.py): rank 0 evaluates, and its
metric and its clock's word on the time limit reach every rank, so all stop at the same step."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from autotune.search import recipe
from autotune.search.knob import PRECISIONS
from autotune.train import systems, telemetry
from autotune.train.config import Diverged, Limits, Progress, TrialConfig, TrialResult
from autotune.train.distributed import ALONE, Ranks
from autotune.train.evaluation import evaluate
from autotune.train.ledger import Ledger
from autotune.train.loader import endless, make_loader
from autotune.train.measure import Clock, reset_peak_memory, threads_for
from autotune.train.tasks import Task, takes

# Steps between looks at whether the loss stayed finite: each look waits for the device (a host
# sync), so on CUDA it comes every few steps, and the step it names is kept on the device. The
# loss's mean is read only at evaluations, where the paused clock has already waited.
FINITE_CHECK_EVERY = 8
# autocast's
DTYPES = {name: getattr(torch, precision.dtype) for name, precision in PRECISIONS.items()}


def run(
    task: Task,
    config: TrialConfig,
    *,
    limits: Limits,
    device: torch.device,
    seed: int,
    progress: Progress | None = None,
    ranks: Ranks = ALONE,
) -> TrialResult:
    """Train `task` with `config` until the target (unless `limits.stop_at_target` is off), the end
    of its schedule, the epoch limit or the time limit; as one of `ranks`, with `device` its own.

    With the target not stopping it, `time_to_target` is still when the metric first reached it.
    """
    # Set up: seeds, CPU threads, the memory figure; a batch larger than the data is an error.
    seed_everything(seed)
    torch.set_num_threads(threads_for(config.num_workers, processes=ranks.world_size))
    reset_peak_memory(device)
    n_train = len(task.train)
    _check_effective_batch(config, n_train, ranks=ranks.world_size)

    # Build, on the clock: before the DataLoader, as worker start-up is a real cost of num_workers.
    clock = Clock(device)
    clock.start()
    training = build(task, config, limits=limits, device=device, seed=seed, ranks=ranks)
    ledger = Ledger.start(
        limits, n_train=n_train, total_steps=training.total_steps, ranks=ranks.world_size
    )
    steps_per_epoch = len(training.loader) / config.accumulation_steps
    batches = endless(training.loader)
    watch = LossWatch(device)
    waiting = telemetry.InputWait()
    fetch = waiting.timed(batches)
    sampler = telemetry.Sampler(telemetry.nvml_reader(device)).start()
    try:
        with (
            _compile_failures(config.compile),
            warnings.catch_warnings(),
            systems.process_settings(cudnn_benchmark=config.cudnn_benchmark, tf32=config.tf32),
        ):
            # GradScaler skips the optimizer step when it sees inf; the schedule still advances.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
            # Train: one optimizer step per effective batch, to the end of the schedule at most.
            while ledger.steps < training.total_steps:
                group = list(itertools.islice(fetch, config.accumulation_steps))
                watch.see(training.step(group), ledger.steps + 1)
                training.scheduler.step()
                ledger.stepped(group)
                if ledger.steps % FINITE_CHECK_EVERY == 0:
                    watch.check(steps_per_epoch=steps_per_epoch)
                if ledger.steps == ledger.warm_steps:  # the throughput figure starts here
                    ledger.warm = (clock.read(), ledger.samples, waiting.seconds)
                out_of_time = ranks.agree(clock.read(sync=False) >= limits.max_seconds)
                # Evaluate on a paused clock: every eval_every epochs, at the end, out of time.
                if ledger.evaluation_due(out_of_time=out_of_time):
                    clock.stop()
                    watch.check(steps_per_epoch=steps_per_epoch)
                    loss = watch.mean()  # finite: check has just looked; this rank's
                    metric, confusion = ranks.from_main(
                        lambda: evaluate(
                            training.evaluated,
                            task,
                            device=device,
                            autocast=training.autocast,
                            channels_last=config.channels_last,
                        )
                    )
                    ledger.evaluated(metric, confusion, seconds=clock.elapsed, loss=loss)
                    # Stop at the target (where it stops the run) or out of time; else train on.
                    if ledger.stops(out_of_time=out_of_time):
                        break
                    clock.start()
                if progress is not None:
                    progress(*ledger.told(clock))
    finally:
        batches.close()  # shuts down DataLoader workers even when training raised
        gpu = sampler.stop()
    if clock.running:
        clock.stop()

    # Result: the clock, the curve, and the speed and input wait after warm-up.
    return ledger.result(clock, waited=waiting.seconds, device=device, gpu=gpu)


def _check_effective_batch(config: TrialConfig, n_train: int, *, ranks: int = 1) -> None:
    effective = config.batch_size * config.accumulation_steps * ranks
    if effective > n_train:
        raise ValueError(
            f"an effective batch of {effective} is larger than the {n_train} training samples"
        )


@contextlib.contextmanager
def _compile_failures(compiling: bool) -> Iterator[None]:
    """A torch.compile failure raised as CompileFailed: one line, not the compiler's page of
    context. Any other exception passes unchanged."""
    try:
        yield
    except Exception as exc:
        reason = systems.compile_failure(exc) if compiling else None
        if reason is None:
            raise
        raise systems.CompileFailed(reason) from None


@dataclasses.dataclass(frozen=True)
class Training:
    """What one run trains with, built fresh from its configuration."""

    loader: DataLoader
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
    loader = make_loader(task.train, config, seed=seed, device=device, ranks=ranks)
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


class LossWatch:
    """Watches the loss without a host sync per step: the first step at which it is NaN or
    infinite, and the sum since the last evaluation, stay on the device until `check` and `mean`
    read them."""

    def __init__(self, device: torch.device) -> None:
        self.first_step = torch.zeros((), dtype=torch.long, device=device)  # 0: none yet
        self.value = torch.zeros((), device=device)
        self.total = torch.zeros((), device=device)
        self.steps = 0  # summed in `total`: counted on the host, which knows without asking

    def see(self, loss: torch.Tensor, step: int) -> None:
        loss = loss.float()  # a half-precision sum would lose the small terms
        new = ~torch.isfinite(loss) & (self.first_step == 0)
        self.first_step = torch.where(new, step, self.first_step)
        self.value = torch.where(new, loss, self.value)
        self.total = self.total + loss
        self.steps += 1

    def mean(self) -> float | None:
        """The mean loss of the steps seen since the last call (None: none), which starts the next
        sum. Reading it waits for the device: call it where the loop has waited already."""
        if not self.steps:
            return None
        mean = float(self.total) / self.steps
        self.total, self.steps = torch.zeros_like(self.total), 0
        return mean

    def check(self, *, steps_per_epoch: float) -> None:
        """Raise Diverged when a step so far had a non-finite loss."""
        step = int(self.first_step)
        if step:
            raise Diverged(
                f"loss became {float(self.value)} at step {step} "
                f"(epoch {step / steps_per_epoch:.2f}): the learning rate is likely too high"
            )


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
