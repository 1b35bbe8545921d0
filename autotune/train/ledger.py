"""What one run counts as it trains (trial.py's loop): optimizer steps and samples, where warm-up
ended, the curve of its evaluations, when the target was first reached, and why it stopped; and
the TrialResult they make.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import torch

from autotune.train import telemetry
from autotune.train.config import Diverged, Limits, TrialResult
from autotune.train.measure import Clock, device_name, peak_memory

WARMUP_FRACTION = 0.1  # of a trial's optimizer steps, left out of the throughput figure
MIN_WARMUP_STEPS = 3


def warm_up_steps(total_steps: int) -> int:
    """The optimizer steps of a run of `total_steps` that the throughput figure leaves out."""
    return max(MIN_WARMUP_STEPS, math.ceil(WARMUP_FRACTION * total_steps))


@dataclasses.dataclass
class Ledger:
    """One run's bookkeeping, from its first optimizer step to its result."""

    limits: Limits
    n_train: int  # training samples: an epoch
    ranks: int  # processes that each train a micro-batch of every step (distributed.Ranks)
    total_steps: int  # optimizer steps the run may take
    warm_steps: int
    eval_interval: float  # training samples between evaluations
    next_eval: float  # training samples at which the next evaluation is due
    steps: int = 0
    samples: int = 0
    warm: tuple[float, int, float] | None = None  # clock, samples and input wait when warm-up ended
    curve: list[tuple[float, float, float]] = dataclasses.field(default_factory=list)
    # the mean training loss since the evaluation before, beside each of the curve's points
    losses: list[float | None] = dataclasses.field(default_factory=list)
    metric: float | None = None  # at the last evaluation
    confusion: list[list[int]] | None = None  # at the last evaluation
    reached_at: float | None = None  # the clock at the first evaluation that reached the target
    reached_samples: int | None = None  # the training samples seen by then
    stop_reason: str = "max_epochs"

    @classmethod
    def start(cls, limits: Limits, *, n_train: int, total_steps: int, ranks: int = 1) -> Ledger:
        eval_interval = limits.eval_every * n_train
        return cls(
            limits=limits,
            n_train=n_train,
            ranks=ranks,
            total_steps=total_steps,
            warm_steps=warm_up_steps(total_steps),
            eval_interval=eval_interval,
            next_eval=eval_interval,
        )

    def stepped(self, group: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """One optimizer step taken, over the micro-batches of `group` on each rank (every rank's
        are as many and as large: the samplers give each the same share, drop_last the rest)."""
        self.steps += 1
        self.samples += sum(len(targets) for _, targets in group) * self.ranks

    def evaluation_due(self, *, out_of_time: bool) -> bool:
        """Every `eval_every` epochs, after the last step, and when the time is up."""
        return self.samples >= self.next_eval or self.steps == self.total_steps or out_of_time

    def evaluated(
        self,
        metric: float,
        confusion: list[list[int]] | None,
        *,
        seconds: float,
        loss: float | None = None,
    ) -> None:
        """An evaluation's metric at `seconds` on the training clock, with the mean training
        `loss` since the one before; the next falls due at the next multiple of the interval."""
        if not math.isfinite(metric):
            raise Diverged(
                f"metric is {metric} at epoch {self.samples / self.n_train:.2f}: "
                f"the model's outputs or the task's metric are not finite numbers"
            )
        self.metric, self.confusion = metric, confusion
        self.curve.append((seconds, self.samples / self.n_train, metric))
        self.losses.append(loss)
        if self.limits.reached(metric) and self.reached_at is None:
            self.reached_at, self.reached_samples = seconds, self.samples
        self.next_eval = (math.floor(self.samples / self.eval_interval) + 1) * self.eval_interval

    def stops(self, *, out_of_time: bool) -> bool:
        """Whether the run ends at the evaluation just made: at the target (where reaching it
        stops the run, the first reach is this one) or out of time; its stop reason is then set."""
        if self.reached_at is not None and self.limits.stop_at_target:
            self.stop_reason = "target"
            return True
        if out_of_time:
            self.stop_reason = "max_seconds"
            return True
        return False

    def told(self, clock: Clock) -> tuple[int, int, float | None, float, float]:
        """What a progress callback is told now (train/config.Progress)."""
        return self.steps, self.total_steps, self.metric, clock.read(sync=False), clock.paused

    def result(
        self,
        clock: Clock,
        *,
        waited: float,
        device: torch.device,
        gpu: dict[str, float] | None,
    ) -> TrialResult:
        """The run's result, its `clock` stopped, after `waited` seconds of input wait."""
        elapsed = clock.elapsed
        throughput, input_wait = self._after_warm_up(elapsed=elapsed, waited=waited)
        return TrialResult(
            reached=self.reached_at is not None,
            time_to_target=self.reached_at,
            best_metric=functools.reduce(self.limits.better, (m for _, _, m in self.curve)),
            train_seconds=elapsed,
            epochs=self.samples / self.n_train,
            optimizer_steps=self.steps,
            samples_per_second=throughput,
            peak_memory_bytes=peak_memory(device),
            device_name=device_name(device),
            torch_version=torch.__version__,
            stop_reason=self.stop_reason,
            curve=tuple(self.curve),
            input_wait_fraction=input_wait,
            gpu=gpu,
            confusion=self.confusion,
            samples_to_target=self.reached_samples,
            train_loss=tuple(self.losses),
            paused_seconds=clock.paused,
        )

    def _after_warm_up(self, *, elapsed: float, waited: float) -> tuple[float | None, float | None]:
        """Samples per second and the share of time spent waiting for input, after warm-up. Too
        few steps for that: no throughput, and the input wait with warm-up included."""
        warm = self.warm
        # no step ran after warm-up
        if warm is None or elapsed <= warm[0] or self.samples <= warm[1]:
            return None, telemetry.wait_fraction(waited, elapsed)
        return (self.samples - warm[1]) / (elapsed - warm[0]), telemetry.wait_fraction(
            waited - warm[2], elapsed - warm[0]
        )
