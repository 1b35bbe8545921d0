"""Run one configuration: build the loader, model and optimizer, train, evaluate, time.

A trial is a function of its configuration. It never sees Optuna; exceptions (an OOM among
them) propagate to the caller, which classifies them.

Time to target: the clock starts before the DataLoader is built, runs through every
training step, pauses for each evaluation, and stops at the first evaluation whose metric reaches
the target. CUDA work is synchronized before the clock is read for a measurement.

On several devices every rank runs this loop (train/ranks.py): rank 0 evaluates, and its
metric and its clock's word on the time limit reach every rank, so all stop at the same step."""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator

import torch

from autotune.train import first_steps, systems, telemetry
from autotune.train.config import Diverged, Limits, Progress, TrialConfig, TrialResult
from autotune.train.evaluation import evaluate
from autotune.train.ledger import Ledger
from autotune.train.loader import training_pairs
from autotune.train.measure import Clock, reset_peak_memory, threads_for
from autotune.train.ranks import ALONE, Ranks
from autotune.train.tasks import Task
from autotune.train.training import Training, build, seed_everything

# Steps between looks at whether the loss stayed finite: each look waits for the device (a host
# sync), so on CUDA it comes every few steps, and the step it names is kept on the device. The
# loss's mean is read only at evaluations, where the paused clock has already waited.
FINITE_CHECK_EVERY = 8


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
    n_train = _set_up(task, config, limits=limits, device=device, seed=seed, ranks=ranks)

    # Build, on the clock: before the DataLoader, as worker start-up is a real cost of num_workers.
    clock = Clock(device)
    clock.start()
    training = build(task, config, limits=limits, device=device, seed=seed, ranks=ranks)
    ledger = Ledger.start(
        limits, n_train=n_train, total_steps=training.total_steps, ranks=ranks.world_size
    )
    steps_per_epoch = len(training.loader) / config.accumulation_steps
    batches = training_pairs(training.loader)
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
                    metric, confusion = _evaluated(training, task, config, device, ranks)
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


def _set_up(
    task: Task,
    config: TrialConfig,
    *,
    limits: Limits,
    device: torch.device,
    seed: int,
    ranks: Ranks,
) -> int:
    """Everything before the clock starts; the training set's size."""
    # What this process's first steps load is its cost, not this configuration's.
    first_steps.take_before(task, config, limits=limits, device=device, seed=seed)
    seed_everything(seed)
    torch.set_num_threads(threads_for(config.num_workers, processes=ranks.world_size))
    reset_peak_memory(device)
    n_train = len(task.train)
    _check_effective_batch(config, n_train, ranks=ranks.world_size)  # more than the data: an error
    return n_train


def _evaluated(
    training: Training, task: Task, config: TrialConfig, device: torch.device, ranks: Ranks
) -> tuple[float, list[list[int]] | None]:
    """The validation metric and confusion counts: the main rank's, given to every rank."""
    return ranks.from_main(
        lambda: evaluate(
            training.evaluated,
            task,
            device=device,
            autocast=training.autocast,
            channels_last=config.channels_last,
        )
    )


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
