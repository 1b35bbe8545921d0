"""What a trial takes and gives back: its configuration, its limits, its result, and the
progress callback; shared by the loop, the runners and the study.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from autotune.search.knob import DDP_KNOBS
from autotune.search.space import KNOBS, filled
from autotune.spec.sections import reaches

# (optimizer steps, total steps, last metric, training-clock seconds, seconds off that clock so
# far: its evaluations). It may raise to stop the trial (isolation.Pruned): the exception leaves
# `run` as it is, after the loader is shut down.
Progress = Callable[[int, int, "float | None", float, float], None]


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """The knobs of one training run, and the user's own parameters (`space.params`)."""

    lr: float
    scheduler: str
    batch_size: int
    accumulation_steps: int
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    precision: str
    schedule_epochs: float | None = None  # None: the schedule is the limits' max_epochs long
    # the training set kept on the device and batched there (loader.DeviceLoader): no workers
    data_on_device: bool = False
    channels_last: bool = False
    compile: bool = False
    cudnn_benchmark: bool = False
    tf32: bool = False
    fused_optimizer: bool = False
    # true: every block of the model's checkpoint_blocks(); a fraction: the first share of them
    checkpointing: bool | float = False
    # DistributedDataParallel's (search/knob.DDP_KNOBS); read only on several devices
    ddp_bucket_cap_mb: int = DDP_KNOBS["bucket_cap_mb"].absent
    ddp_gradient_as_bucket_view: bool = DDP_KNOBS["gradient_as_bucket_view"].absent
    ddp_static_graph: bool = DDP_KNOBS["static_graph"].absent
    # (name, value) pairs: hashable, in the study file's order
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrialConfig:
        """From a flat mapping: the knobs by name, every other key a parameter."""
        knobs = [f.name for f in dataclasses.fields(cls) if f.name != "params"]
        # A knob may be absent from a configuration stored before it was a knob: it ran without it.
        full = filled(values)
        return cls(
            **{name: full[name] if name in KNOBS else values[name] for name in knobs},
            params=tuple((k, v) for k, v in values.items() if k not in knobs),
        )

    def as_dict(self) -> dict[str, Any]:
        """Flat: the knobs, then the parameters."""
        knobs = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"
        }
        return {**knobs, **dict(self.params)}


class Diverged(ArithmeticError):
    """Training produced a non-finite loss or metric: the trial ends there, as one that cannot
    win."""


@dataclasses.dataclass(frozen=True)
class Limits:
    target: float  # metric value that ends the trial as feasible
    # training stops here; also the schedule's length when the configuration gives none
    max_epochs: float
    max_seconds: float  # training clock
    eval_every: float  # epochs between evaluations
    stop_at_target: bool = True  # False: train the whole schedule (the fixed_schedule objective)
    minimize: bool = False  # lower is better (a loss): reached at or below `target`

    def reached(self, metric: float) -> bool:
        return reaches(metric, self.target, minimize=self.minimize)

    def better(self, a: float, b: float) -> float:
        """The better of two values of the metric."""
        return min(a, b) if self.minimize else max(a, b)


@dataclasses.dataclass(frozen=True)
class TrialResult:
    reached: bool
    time_to_target: float | None  # training-clock seconds; None when the target was not reached
    best_metric: float
    train_seconds: float  # training clock when the trial stopped
    # None where the training is not autotune's to count (an objective function)
    epochs: float | None
    optimizer_steps: int | None
    samples_per_second: float | None  # after warm-up; None when too few steps ran
    peak_memory_bytes: int | None  # CUDA: allocator peak; CPU: process peak RSS
    device_name: str
    torch_version: str
    # "target", "max_epochs" (the schedule ended), "max_seconds"; "objective" when an objective
    # function missed
    stop_reason: str
    # (train seconds, epochs, metric) per evaluation
    curve: tuple[tuple[float, float | None, float], ...]
    # Telemetry (telemetry.py); None where it was not measured (a command, an objective function).
    # of training time after warm-up, spent waiting for batches
    input_wait_fraction: float | None = None
    gpu: dict[str, float] | None = None  # NVML figures while training; None without an NVIDIA GPU
    confusion: list[list[int]] | None = None  # at the last evaluation, for classification tasks
    # Training samples seen by the evaluation that first reached the target (evaluations are not
    # counted): what the run needed, whatever the machine's speed. None: not reached, or not
    # counted.
    samples_to_target: int | None = None
    # The mean training loss (as the task's loss returns it) over the optimizer steps since the
    # previous evaluation, one beside each point of `curve`; None where none was measured (an
    # objective function, a command that reports none), as is a command's point without one.
    train_loss: tuple[float | None, ...] | None = None
    # Wall seconds off the training clock once it had started: evaluations, and stopping the
    # loader's workers at the end. None where not measured (a command, an objective function).
    paused_seconds: float | None = None

    @property
    def final_metric(self) -> float:
        """The metric at the last evaluation: what a fixed schedule ends with."""
        return self.curve[-1][2] if self.curve else self.best_metric
