"""A systems setting's two rates, measured apart: the loader's and the compute's.

On a GPU host the input pipeline runs on CPU cores and the training step on the GPU, so a
setting's speed is about the slower of two rates that can each be measured alone, in seconds:

- the loader's: the task's training Dataset through a DataLoader with the setting's workers,
  prefetching and pinning, each batch copied to the device, nothing else;
- the compute's: forward, backward and optimizer step at the setting's precision and memory
  format, on batches already on the device.

So a space of L loader settings and C compute settings takes L + C measurements, not L x C.
Start-up (workers up and the first batches; building, compiling and the first steps) is timed
apart as a fixed cost. Every setting stays built between its windows and the windows run
interleaved (throughput.interleave) until their spread is small; a setting that runs out of
memory is a result (`oom`), and bounds the batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

import torch

from autotune import signals
from autotune.probe.throughput import BURSTS, WINDOW_STEPS, in_turn, measure_sessions, spread
from autotune.train import first_steps
from autotune.train.config import Limits, TrialConfig
from autotune.train.ledger import MIN_WARMUP_STEPS
from autotune.train.loader import pair, training_batches, training_pairs
from autotune.train.measure import Clock, allocator_mark, allocator_peak_since, threads_for
from autotune.train.systems import process_settings, to_device
from autotune.train.tasks import Task
from autotune.train.training import build, seed_everything

K = TypeVar("K", bound=Hashable)
KEPT_BATCHES = 4  # distinct batches the compute cycles through, already on the device
# compute settings measured side by side at once: each holds a model, its optimizer and a few
# batches on the device, and an out-of-memory error among too many would be taken for the setting's
COMPUTE_GROUP = 4
# Windows of one loader alone, at most. Its workers deliver in bursts, and where a window's edges
# fall among them moves its figure: a few workers' windows spread past MAX_SPREAD however many are
# timed (4 workers on an H100 host: 25% after 20 windows, against 6-10% for 8 or 16), so more
# rounds only spend the probe's time.
LOADER_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class Rate:
    """One setting's rate on this machine, in samples a second."""

    samples_per_second: float | None  # median over its windows; None: no figure
    spread: float | None  # interquartile range / median of its windows
    windows: int
    fixed_seconds: float  # start-up beyond what its first batches take at full speed
    # the device's allocator peak, less what the sessions beside it held (CUDA only)
    peak_memory_bytes: int | None = None
    oom: bool = False
    reason: str | None = None
    # what the measuring process's first steps loaded, on a compute rate they preceded
    first_steps_seconds: float | None = None

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure(
    task: Task,
    loaders: Mapping[K, TrialConfig],
    computes: Mapping[K, TrialConfig],
    *,
    device: torch.device,
    seed: int,
    window_steps: int = WINDOW_STEPS,
    **rounds: Any,
) -> dict[K, Rate]:
    """The loader rate of each of `loaders` (only its loader settings and batch size matter) and
    the compute rate of each of `computes` (all but its loader settings; its num_workers sets
    only the torch threads), interleaved in one series of rounds; keys must differ between the
    two. `rounds`: interleave's options."""
    first_load = None
    if computes:  # untimed, or the first setting measured would carry them
        plain = first_steps.plain(next(iter(computes.values())))
        first_load = first_steps.take_once(
            device, lambda: _ComputeSession(task, plain, device=device, seed=seed, window_steps=1)
        )
    builders = {
        key: functools.partial(
            _LoaderSession if key in loaders else _ComputeSession,
            task,
            config,
            device=device,
            seed=seed,
            window_steps=window_steps,
            **({"interleaved": len(loaders) + len(computes) > 1} if key in loaders else {}),
        )
        for key, config in [*loaders.items(), *computes.items()]
    }
    measured = measure_sessions(builders, out_of_memory=_out_of_memory, **rounds)
    return {
        k: dataclasses.replace(r, first_steps_seconds=first_load) if k in computes else r
        for k, r in measured.items()
    }


def measure_in_groups(
    task: Task,
    computes: Mapping[K, TrialConfig],
    size: int,
    *,
    device: torch.device,
    seed: int,
    window_steps: int = WINDOW_STEPS,
    **rounds: Any,
) -> dict[K, Rate]:
    """The compute rate of each of `computes`, `size` at a time side by side (each holds a model,
    its optimizer and a few batches on the device: too many at once, and an out-of-memory error
    would be taken for a setting's), the groups one after another."""
    keys, measured = list(computes), {}
    for start in range(0, len(keys), size):
        signals.check()
        group = {k: computes[k] for k in keys[start : start + size]}
        measured.update(
            measure(task, {}, group, device=device, seed=seed, window_steps=window_steps, **rounds)
        )
    return measured


def measure_loaders_in_turn(
    task: Task,
    loaders: Mapping[K, TrialConfig],
    enough: float | None = None,
    *,
    device: torch.device,
    seed: int,
    window_steps: int = WINDOW_STEPS,
    **rounds: Any,
) -> dict[K, Rate]:
    """The loader rate of each of `loaders`, one at a time in the order given, each setting's
    workers gone before the next starts: side by side, the others' workers would refill their
    queues on the same cores while one is timed. Once one with workers delivers `enough` samples
    a second, the rest are not measured (no figure, and the reason): given fewest workers first,
    each would only feed the same step (one with none loads between the steps, however fast)."""
    builders = {
        key: functools.partial(
            _LoaderSession, task, config, device=device, seed=seed, window_steps=window_steps
        )
        for key, config in loaders.items()
    }
    workers = {key for key, config in loaders.items() if config.num_workers}
    return in_turn(
        builders,
        out_of_memory=_out_of_memory,
        needless=lambda _, done: (
            f"not measured: a loader before it delivered {enough:,.0f}/s"
            if enough is not None
            and any((done[k].samples_per_second or 0) >= enough for k in done.keys() & workers)
            else None
        ),
        skipped=lambda why: Rate(None, None, 0, 0.0, reason=why),
        **{"max_rounds": LOADER_ROUNDS, **rounds},
    )


def _out_of_memory(reason: str) -> Rate:
    return Rate(None, None, 0, 0.0, oom=True, reason=reason)


class _ApartSession:
    """A part of training (the loader, or the compute) built once and timed a window at a time."""

    device: torch.device
    startup_seconds: float
    warmup_samples: int
    peak_memory_bytes: int | None = None

    def result(self, figures: list[float]) -> Rate:
        if not figures:
            return Rate(None, None, 0, self.startup_seconds, reason="no window was timed")
        speed = statistics.median(figures)
        fixed = max(0.0, self.startup_seconds - self.warmup_samples / speed)
        return Rate(
            speed, spread(figures), len(figures), fixed, peak_memory_bytes=self.peak_memory_bytes
        )

    def _rate(self, work: Callable[[], int]) -> float | None:
        """Samples a second of `work()` (which returns the samples it took), timed on the device."""
        clock = Clock(self.device)
        clock.start()
        samples = work()
        seconds = clock.stop()
        return samples / seconds if seconds > 0 else None

    def close(self) -> None:
        pass


class _LoaderSession(_ApartSession):
    """The loader alone: batches through the DataLoader and onto the device, nothing more."""

    def __init__(
        self,
        task: Task,
        config: TrialConfig,
        *,
        device: torch.device,
        seed: int,
        window_steps: int,
        interleaved: bool = False,
    ) -> None:
        self.config, self.device, self.interleaved = config, device, interleaved
        # Workers started together deliver in bursts of one batch each: a window of many bursts
        # keeps where it starts and ends in a burst from counting.
        self.window_batches = max(
            window_steps * config.accumulation_steps, BURSTS * config.num_workers
        )
        # Batches its workers load ahead while the other settings are timed, and the one after
        # (part-way loaded): taken untimed before each window, or a window would time batches
        # that were ready before it began. Alone, only before its first (the workers loaded
        # ahead during the warm-up); its windows then follow one another.
        self.queued = config.num_workers * (config.prefetch_factor or 0) + (
            1 if config.num_workers else 0
        )
        # its peak (a batch on the device; with data_on_device, the training set's copy too) is
        # its own, not the sessions' built before it
        held = allocator_mark(device)
        clock = Clock(device)
        clock.start()  # before the DataLoader: worker start-up is the loader's fixed cost
        self.batches = training_pairs(training_batches(task, config, seed=seed, device=device))
        try:
            self.warmup_samples = self._take(MIN_WARMUP_STEPS * config.accumulation_steps)
        except BaseException:
            self.close()
            raise
        self.startup_seconds = clock.stop()
        self.peak_memory_bytes = allocator_peak_since(device, held)

    def _take(self, count: int) -> int:
        samples = 0
        for _ in range(count):
            inputs, targets = next(self.batches)
            to_device(
                inputs,
                self.device,
                non_blocking=self.config.pin_memory,
                channels_last=self.config.channels_last,
            )
            targets.to(self.device, non_blocking=self.config.pin_memory)
            samples += len(targets)
        return samples

    def window(self) -> float | None:
        self._take(self.queued)
        if not self.interleaved:
            self.queued = 0
        return self._rate(lambda: self._take(self.window_batches))

    def close(self) -> None:
        self.batches.close()  # shuts its workers down


class _ComputeSession(_ApartSession):
    """The training step alone, on a few batches kept on the device, with the torch threads a
    trial of `config` gets (its loader workers take cores from them on a CPU)."""

    def __init__(
        self, task: Task, config: TrialConfig, *, device: torch.device, seed: int, window_steps: int
    ) -> None:
        self.threads = threads_for(config.num_workers)
        self.config = dataclasses.replace(
            config, data_on_device=False, num_workers=0, prefetch_factor=None, schedule_epochs=None
        )
        self.device, self.window_steps = device, window_steps
        seed_everything(seed)
        held = allocator_mark(device)  # its peak is its own, not the sessions' built before it
        kept = []
        # loaded before the clock: the loader's cost is the other rate's
        for batch in training_batches(task, self.config, seed=seed, device=device):
            inputs, targets = pair(batch, "training set")
            kept.append(
                (
                    to_device(
                        inputs, device, non_blocking=False, channels_last=config.channels_last
                    ),
                    targets.to(device),
                )
            )
            if len(kept) == max(KEPT_BATCHES, config.accumulation_steps):
                break
        self.kept, self.next = kept, 0
        torch.set_num_threads(self.threads)
        clock = Clock(device)
        clock.start()
        self.training = build(task, self.config, limits=_ENDLESS, device=device, seed=seed)
        self.warmup_samples = self._steps(MIN_WARMUP_STEPS)
        self.startup_seconds = clock.stop()
        self.peak_memory_bytes = allocator_peak_since(device, held)

    def _steps(self, count: int) -> int:
        samples = 0
        # the sessions differ in them
        with process_settings(cudnn_benchmark=self.config.cudnn_benchmark, tf32=self.config.tf32):
            for _ in range(count):
                group = []
                for _ in range(self.config.accumulation_steps):
                    group.append(self.kept[self.next % len(self.kept)])
                    self.next += 1
                self.training.step(group)
                self.training.scheduler.step()
                samples += sum(len(targets) for _, targets in group)
        return samples

    def window(self) -> float | None:
        torch.set_num_threads(self.threads)
        return self._rate(lambda: self._steps(self.window_steps))


_ENDLESS = Limits(target=math.inf, max_epochs=1e6, max_seconds=math.inf, eval_every=1e6)
