"""The training recipe: what a trial builds around the knobs' values, as data and pure functions.

The optimizer's arguments, the LR schedules, the DataLoader's arguments and the CPU thread rules
live here once. The training loop (trial.py) and the built-in tasks build from them, and every
export reads them, so that a winner trains in another trainer as it did in its trial. No torch
here, so that exports read it cheaply: torch classes are named, and train resolves the names.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

# The optimizer: the default Task.optimizer, as a study records it (tasks.reference), and its
# arguments besides lr: SGD with Nesterov momentum, the usual choice for small CNNs.
BUILT_IN_OPTIMIZER = "autotune.train.tasks:sgd"
SGD_ARGS: dict[str, Any] = {"momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """An LR schedule as a class of torch.optim.lr_scheduler with its arguments (the optimizer
    aside), stepped once per optimizer step over the run's total optimizer steps."""

    torch_class: str
    init_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # fixed
    # Arguments counted in optimizer steps: these fractions of the run's total, each rounded down.
    of_total_steps: Mapping[str, float | tuple[float, ...]] = dataclasses.field(
        default_factory=dict
    )
    peak_lr: str | None = (
        None  # the argument that takes the lr knob, for a schedule that sets the lr itself
    )
    warmup: str | None = (
        None  # the argument that takes onecycle_pct_start(the run's optimizer steps)
    )
    min_steps: int = 1  # a run of fewer optimizer steps keeps the peak lr: the constant schedule


# OneCycleLR warms up over this fraction of the steps...
ONECYCLE_PCT_START = 0.25
# ...but over at least this many: it divides by the warm-up's length in steps less one, which is
# 0 or less for a quarter of 4 steps or fewer.
ONECYCLE_MIN_WARMUP_STEPS = 1.5

SCHEDULES: dict[str, Schedule] = {
    # factor 1: the lr never changes
    "constant": Schedule("ConstantLR", {"factor": 1.0, "total_iters": 0}),
    "step": Schedule("MultiStepLR", {"gamma": 0.1}, {"milestones": (0.5, 0.75)}),
    "cosine": Schedule("CosineAnnealingLR", {}, {"T_max": 1.0}),
    # One step has no cycle.
    "onecycle": Schedule(
        "OneCycleLR", {}, {"total_steps": 1.0}, peak_lr="max_lr", warmup="pct_start", min_steps=2
    ),
}


def onecycle_pct_start(total_steps: int) -> float:
    """OneCycleLR's pct_start for a run of `total_steps` optimizer steps."""
    return max(ONECYCLE_PCT_START, ONECYCLE_MIN_WARMUP_STEPS / total_steps)


def schedule_for(name: str, *, total_steps: int) -> Schedule:
    """The schedule a run of `total_steps` optimizer steps uses for the scheduler knob `name`."""
    if name not in SCHEDULES:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULES)}, but got {name=}.")
    schedule = SCHEDULES[name]
    return SCHEDULES["constant"] if total_steps < schedule.min_steps else schedule


def steps(fraction: float, total_steps: int) -> int:
    """A fraction of the run's optimizer steps, rounded down."""
    return math.floor(fraction * total_steps)


def scheduler_args(name: str, *, total_steps: int, lr: float) -> tuple[str, dict[str, Any]]:
    """The torch.optim.lr_scheduler class and its keyword arguments (the optimizer aside) for the
    scheduler knob `name` over `total_steps` optimizer steps, peaking at `lr`."""
    schedule = schedule_for(name, total_steps=total_steps)
    args = dict(schedule.init_args)
    for arg, fraction in schedule.of_total_steps.items():
        args[arg] = (
            [steps(f, total_steps) for f in fraction]
            if isinstance(fraction, tuple)
            else steps(fraction, total_steps)
        )
    if schedule.peak_lr:
        args[schedule.peak_lr] = lr
    if schedule.warmup:
        args[schedule.warmup] = onecycle_pct_start(total_steps)
    return schedule.torch_class, args


def loader_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The DataLoader keyword arguments the loader knobs mean (the dataset aside), as a trial
    builds its loader and as exports write it. prefetch_factor exists only with workers; the
    trial pins memory only on CUDA, where page-locked buffers help the copies."""
    workers = config["num_workers"]
    kwargs = {
        "batch_size": config["batch_size"],
        "shuffle": True,
        # equal micro-batches keep accumulation exact and BatchNorm away from size 1
        "drop_last": True,
        "num_workers": workers,
    }
    if workers > 0:
        kwargs["prefetch_factor"] = config["prefetch_factor"]
    kwargs["persistent_workers"] = workers > 0  # otherwise every epoch pays worker start-up again
    kwargs["pin_memory"] = config["pin_memory"]
    return kwargs


WORKER_THREADS = 1  # torch threads in each DataLoader worker: one process on one core


def cores() -> int:
    """The cores this process may run on (its affinity, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_env(num_workers: int, *, processes: int = 1) -> dict[str, str]:
    """OMP_NUM_THREADS and MKL_NUM_THREADS for a training command, as an in-process trial sets
    torch's threads: the cores its loader workers leave, shared by its `processes`."""
    count = str(training_threads(cores(), num_workers, processes=processes))
    return {"OMP_NUM_THREADS": count, "MKL_NUM_THREADS": count}


def training_threads(cores: int, num_workers: int, *, processes: int = 1) -> int:
    """Torch threads for each of `processes` training processes (a trial's ranks) that share
    `cores`: an equal part of the cores their loader workers leave free.

    Oversubscribed cores slowed small-batch CPU training by more than 10x.
    """
    return max(1, (cores - num_workers * processes) // processes)
