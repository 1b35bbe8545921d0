"""Training throughput of systems settings, measured apart from what a run learns.

A time to target mixes how many samples a run needs (the maths: lr, schedule, effective batch,
seed) with how fast this machine trains them (micro-batch, loader, precision, memory format,
compilation, and whatever else the machine is doing). This measures the second alone, as
airbench and Pollux do: the real DataLoader in the loop (its workers running on across epochs, as
in a trial), warm-up and start-up apart, and the configurations interleaved in rounds so
that a drift in the machine's speed falls on all of them alike, until every configuration's
windows agree (interquartile range / median at most `max_spread`) or a cap on rounds is hit.

Every configuration's training stays built between its windows, so they share the device: a
configuration that runs out of memory while building or warming up is a result (`oom`), not an
error.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from autotune.train import oom
from autotune.train.config import Limits, TrialConfig
from autotune.train.ledger import MIN_WARMUP_STEPS
from autotune.train.loader import training_pairs
from autotune.train.measure import Clock, LoadMeter, threads_for
from autotune.train.systems import process_settings
from autotune.train.tasks import Task
from autotune.train.training import build, seed_everything

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
WINDOW_STEPS = 10  # optimizer steps per timed window
MIN_WINDOWS = 3  # before a spread means anything
MAX_ROUNDS = 20
# Windows that still disagree after this many rounds while other processes keep at least
# BUSY_ROUNDS_CORES of the cores busy stop there: the load, not too few windows, spreads them, and
# more rounds would spend the probe's time cap without settling them (their median is kept).
BUSY_ROUNDS = 6
BUSY_ROUNDS_CORES = 0.5
BUSY_ROUNDS_AFTER = 1.0  # seconds of rounds before the load is read
MAX_SPREAD = 0.1  # interquartile range / median of a configuration's windows
# A window holds at least this many batches a loader worker. Workers started together deliver in
# bursts of one batch each, and where a shorter window's edges fall among them moves its figure:
# on the paced task, 16 workers held by their loader measured 20% low in windows of 10 steps,
# which never agreed (spread 117% after 20), and within 1% in 3 windows of 32 or more.
BURSTS = 8
BRIEF_WINDOWS = 5  # the most windows measure_briefly times a setting


@dataclasses.dataclass(frozen=True)
class Throughput:
    """One systems configuration's training speed on this machine."""

    samples_per_second: float | None  # median over its windows; None: no figure (out of memory)
    spread: float | None  # interquartile range / median of its windows
    windows: int  # timed windows that count
    startup_seconds: float  # building the loader, model and optimizer, and the warm-up steps
    warmup_samples: int = 0  # trained during the warm-up steps
    oom: bool = False
    reason: str | None = None  # why it has no figure
    # optimizer steps per timed window (fewer where epochs are short)
    window_steps: int = WINDOW_STEPS

    @property
    def fixed_seconds(self) -> float | None:
        """Start-up beyond what its warm-up steps take at full speed: loader start, compilation,
        the first cuDNN searches. None without a speed."""
        if self.samples_per_second is None:
            return None
        return max(0.0, self.startup_seconds - self.warmup_samples / self.samples_per_second)


def spread(values: Sequence[float]) -> float:
    """Interquartile range over the median: 0 when every window agrees."""
    if len(values) < 2:
        return math.inf
    low, _, high = statistics.quantiles(values, n=4, method="inclusive")
    return (high - low) / statistics.median(values)


# Wall-clock time (time.time()) past which a measurement in this process times no more rounds
# than one window of each configuration: the systems probe's time cap (stop_rounds_at).
_stop_at: float | None = None


def stop_rounds_at(_task: Task, when: float | None, *, device: torch.device, seed: int) -> None:
    """From `when` on (time.time(); None: never), every measurement in this process ends its
    rounds once each configuration has a window: run where the probe measures, so that its time
    cap reaches into a measurement already under way (on a busy machine one that would go on for
    minutes, its windows never agreeing)."""
    global _stop_at
    _stop_at = when


def interleave(
    windows: Mapping[K, Callable[[], float | None]],
    *,
    min_windows: int = MIN_WINDOWS,
    max_rounds: int = MAX_ROUNDS,
    max_spread: float = MAX_SPREAD,
) -> dict[K, list[float]]:
    """Each round times one window of every configuration, always in the same order; rounds go
    on until every configuration has `min_windows` figures whose spread is at most `max_spread`,
    or for `max_rounds` (BUSY_ROUNDS where other processes keep the cores busy). A window that
    returns None (no time measured) adds nothing."""
    figures: dict[K, list[float]] = {key: [] for key in windows}
    load = LoadMeter()
    for index in range(max_rounds):
        for key, window in windows.items():
            value = window()
            if value is not None:
                figures[key].append(value)
        if all(len(f) >= min_windows and spread(f) <= max_spread for f in figures.values()):
            break
        if _stop_at is not None and time.time() >= _stop_at and all(figures.values()):
            break
        if (
            index + 1 >= BUSY_ROUNDS
            and all(len(f) >= min_windows for f in figures.values())
            and (load.cores(after=BUSY_ROUNDS_AFTER) or 0.0) >= BUSY_ROUNDS_CORES
        ):
            break
    return figures


def measure(
    task: Task,
    configs: Mapping[K, TrialConfig],
    *,
    device: torch.device,
    seed: int,
    window_steps: int = WINDOW_STEPS,
    **rounds: Any,
) -> dict[K, Throughput]:
    """The throughput of each configuration of `configs` (only its systems settings matter),
    interleaved; `rounds`: interleave's min_windows, max_rounds and max_spread."""
    builders = _builders(task, configs, device, seed, window_steps, interleaved=len(configs) > 1)
    return measure_sessions(builders, out_of_memory=_out_of_memory, **rounds)


def measure_in_turn(
    task: Task,
    configs: Mapping[K, TrialConfig],
    needless: Callable[[K, Mapping[K, Throughput]], str | None] | None = None,
    step_held: Collection[K] = (),
    *,
    device: torch.device,
    seed: int,
    window_steps: int = WINDOW_STEPS,
    **rounds: Any,
) -> dict[K, Throughput]:
    """As `measure`, but each configuration alone, one after the other (in_turn): for settings
    with loader workers on a GPU host, where interleaving would time one while the others'
    workers refill their queues on the same cores. `needless(key, measured so far)`: why a
    configuration need not be measured (None: measure it); it then has no figure, and that
    reason. `step_held`: those predicted to be held by their step, their loader well ahead: their
    queue stays full, so their windows need not hold several of its bursts (BURSTS)."""
    builders = _builders(task, configs, device, seed, window_steps, step_held=step_held)
    return in_turn(
        builders,
        out_of_memory=_out_of_memory,
        needless=needless,
        skipped=lambda why: Throughput(None, None, 0, 0.0, reason=why),
        **rounds,
    )


def measure_briefly(
    task: Task, configs: Mapping[K, TrialConfig], *, device: torch.device, seed: int
) -> dict[K, Throughput]:
    """`measure_in_turn`, at most BRIEF_WINDOWS windows each: a round of a paired comparison,
    where pairing with another setting under the same load, not its own windows settling, is what
    steadies a figure (on a busy machine they might never settle)."""
    return measure_in_turn(task, configs, device=device, seed=seed, max_rounds=BRIEF_WINDOWS)


def _builders(
    task: Task,
    configs: Mapping[K, TrialConfig],
    device: torch.device,
    seed: int,
    window_steps: int,
    *,
    interleaved: bool = False,
    step_held: Collection[K] = (),
) -> dict[K, Callable[[], _EndToEndSession]]:
    return {
        key: functools.partial(
            _EndToEndSession,
            task,
            config,
            device=device,
            seed=seed,
            window_steps=window_steps,
            interleaved=interleaved,
            bursts=key not in step_held,
        )
        for key, config in configs.items()
    }


def _out_of_memory(reason: str) -> Throughput:
    return Throughput(None, None, 0, 0.0, oom=True, reason=reason)


def measure_sessions(
    builders: Mapping[K, Callable[[], Any]], *, out_of_memory: Callable[[str], R], **rounds: Any
) -> dict[K, R]:
    """Build every session (`window()` timing one window, `result(figures)`, `close()`), time
    their windows interleaved, and close them; one that runs out of memory while it is built is
    `out_of_memory(reason)`, a result like the others."""
    sessions: dict[K, Any] = {}
    failed: dict[K, R] = {}
    try:
        for key, build_session in builders.items():
            try:
                sessions[key] = build_session()
            except Exception as exc:
                if not oom.is_oom(exc):
                    raise
                failed[key] = out_of_memory(oom.oom_reason(exc))
                oom.free_memory()
        figures = interleave({key: s.window for key, s in sessions.items()}, **rounds)
    finally:
        for session in sessions.values():
            session.close()
    measured = {key: sessions[key].result(values) for key, values in figures.items()}
    return {key: measured[key] if key in measured else failed[key] for key in builders}


def in_turn(
    builders: Mapping[K, Callable[[], Any]],
    *,
    out_of_memory: Callable[[str], R],
    skipped: Callable[[str], R],
    needless: Callable[[K, Mapping[K, R]], str | None] | None = None,
    **rounds: Any,
) -> dict[K, R]:
    """measure_sessions for one session at a time, each closed (its loader workers gone) before
    the next is built. `needless(key, results so far)`: why `key` need not be measured (None:
    measure it); it is then `skipped(why)`."""
    results: dict[K, R] = {}
    for key, build_session in builders.items():
        why = needless(key, results) if needless is not None else None
        if why is not None:
            results[key] = skipped(why)
            continue
        results.update(
            measure_sessions({key: build_session}, out_of_memory=out_of_memory, **rounds)
        )
    return results


class _EndToEndSession:
    """One configuration's training, built once and stepped a window at a time."""

    def __init__(
        self,
        task: Task,
        config: TrialConfig,
        *,
        device: torch.device,
        seed: int,
        window_steps: int = WINDOW_STEPS,
        interleaved: bool = False,
        bursts: bool = True,
    ) -> None:
        # The schedule's length does not change the speed; a long one never runs out
        # mid-measurement.
        self.config = dataclasses.replace(config, schedule_epochs=None)
        self.device = device
        seed_everything(seed)
        torch.set_num_threads(threads_for(config.num_workers))
        clock = Clock(device)
        clock.start()  # before the DataLoader: worker start-up is part of the start-up
        self.training = build(
            task,
            self.config,
            limits=Limits(target=math.inf, max_epochs=1e6, max_seconds=math.inf, eval_every=1e6),
            device=device,
            seed=seed,
        )
        self.batches = training_pairs(self.training.loader)
        try:
            self.warmup_samples = self._steps(MIN_WARMUP_STEPS)
        except BaseException:
            self.close()
            raise
        self.startup_seconds = clock.stop()
        # An epoch's start costs a window nothing: the loader's workers run on across it
        # (loader.EpochBatches), as in a trial.
        burst_steps = math.ceil(BURSTS * config.num_workers / config.accumulation_steps)
        self.window_steps = max(window_steps, burst_steps if bursts else 0)
        # While the other configurations are timed, this one's workers fill their queue (alone,
        # while its model was built); a window on those batches would time loading done before it
        # began and overstate a loader-bound setting. So before each window (alone, its first) the
        # batches loaded ahead, and the one part-way loaded, are taken off the queue and dropped,
        # not trained: a ready batch is taken in a moment, where training them (and, held by the
        # loader, what the workers put back meanwhile) took seconds on a GPU. Then a step a worker,
        # untimed, so that a setting held by its step has batches waiting again when timing begins.
        self.ahead = config.num_workers * (config.prefetch_factor or 0) + bool(config.num_workers)
        self.settle_steps = math.ceil(config.num_workers / self.config.accumulation_steps)
        self.interleaved = interleaved
        self.settled = False

    def _steps(self, count: int) -> int:
        """Train `count` optimizer steps: the samples they took."""
        samples = 0
        # the sessions differ in them
        with process_settings(cudnn_benchmark=self.config.cudnn_benchmark, tf32=self.config.tf32):
            for _ in range(count):
                group = [next(self.batches) for _ in range(self.config.accumulation_steps)]
                self.training.step(group)
                self.training.scheduler.step()
                samples += sum(len(targets) for _, targets in group)
        return samples

    def window(self) -> float | None:
        """Samples per second over a window; None where the clock saw no time pass."""
        # the sessions differ in workers
        torch.set_num_threads(threads_for(self.config.num_workers))
        if self.interleaved or not self.settled:
            for _ in range(self.ahead):
                next(self.batches)
            self._steps(self.settle_steps)
            self.settled = True
        clock = Clock(self.device)
        clock.start()
        samples = self._steps(self.window_steps)
        seconds = clock.stop()
        return samples / seconds if seconds > 0 else None

    def result(self, figures: Sequence[float]) -> Throughput:
        if not figures:
            return Throughput(
                None,
                None,
                0,
                self.startup_seconds,
                reason="no window took a measurable time",
                window_steps=self.window_steps,
            )
        speed = statistics.median(figures)
        return Throughput(
            speed,
            spread(figures),
            len(figures),
            self.startup_seconds,
            warmup_samples=self.warmup_samples,
            window_steps=self.window_steps,
        )

    def close(self) -> None:
        self.batches.close()  # shuts its loader's workers down
