"""The roofline of a systems setting: its speed predicted from its loader's and its compute's
rates, measured apart (probe/rates.py), and what holds it there.

With loader workers, batches are loaded while the step computes, so a setting trains at about
the slower of its two rates; with none, the training process loads and then computes each batch,
so their times add. The best predicted setting is the limit of the knob space (for a short run,
the one predicted fastest with its start-up counted: frontier). Which settings are then
measured end to end, and which the measurements choose: decide.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autotune.search.devices import FITS_SHARE
from autotune.search.space import FORMAT_KNOBS, Choices, Space, formats_for, loader_of

# Change speed, never the maths. Compilation is weighed apart (its cost is paid once a trial,
# which a rate does not show), and so is checkpointing: at the probe's one batch it only
# recomputes, while what it buys is a larger batch that fits.
MEASURED_FORMATS = tuple(k for k in FORMAT_KNOBS if k not in ("compile", "checkpointing"))
# Activation checkpointing runs each checkpointed block's forward twice (the shapes ResNet's step
# ran 2.5x slower with it on an H100): where the space's largest micro-batch fits without it, it
# can only slow a trial. The fit is the probe's peak scaled with the batch (an overestimate: the
# weights and the optimizer's state do not grow with it) within the share of the device's memory a
# training run may count on (devices.FITS_SHARE).

INPUT, COMPUTE = "input", "compute"


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One loader setting with one compute setting, and the speed their rates predict."""

    loader: dict[str, Any]
    compute: dict[str, Any]
    loader_rate: float
    compute_rate: float

    @property
    def overlapped(self) -> bool:
        return self.loader["num_workers"] > 0

    @property
    def samples_per_second(self) -> float:
        if self.overlapped:
            return min(self.loader_rate, self.compute_rate)
        return 1.0 / (1.0 / self.loader_rate + 1.0 / self.compute_rate)

    @property
    def bottleneck(self) -> str:
        """`input` when the loader is the slower of the two, else `compute`."""
        return INPUT if self.loader_rate < self.compute_rate else COMPUTE

    @property
    def idle_share(self) -> float:
        """The share of the time the device waits for input (the loader's, for `compute`)."""
        if not self.overlapped:
            return self.samples_per_second / self.loader_rate
        return max(0.0, 1.0 - self.loader_rate / self.compute_rate)

    @property
    def setting(self) -> dict[str, Any]:
        return {**self.loader, **self.compute}

    def figures(self) -> dict[str, Any]:
        """The setting with its prediction, as the probe's outcome stores it."""
        return {
            **self.setting,
            "predicted": self.samples_per_second,
            "loader_rate": self.loader_rate,
            "compute_rate": self.compute_rate,
            "bottleneck": self.bottleneck,
            "idle_share": self.idle_share,
        }


# (loader, compute) -> rate
ComputeRate = Callable[[Mapping[str, Any], Mapping[str, Any]], "float | None"]


def predict(
    loader_rates: Sequence[tuple[Mapping[str, Any], float | None]],
    computes: Sequence[Mapping[str, Any]],
    compute_rate: ComputeRate,
) -> list[Prediction]:
    """Every combination of a measured loader setting with a compute setting, fastest predicted
    first; `compute_rate(loader, compute)` is the compute's rate beside that loader (the same for
    every loader on a GPU; on a CPU its workers take cores from the step). Settings without a
    rate (out of memory, say) are left out."""
    combined = [
        Prediction(dict(loader), dict(compute), loader_rate, rate)
        for loader, loader_rate in loader_rates
        if loader_rate
        for compute in computes
        if (rate := compute_rate(loader, compute))
    ]
    # Equal predictions: fewer workers and the simpler compute first, as the caller listed them.
    return sorted(combined, key=lambda p: -p.samples_per_second)


def frontier(timed: Sequence[tuple[Prediction, float]]) -> list[tuple[Prediction, float]]:
    """Of (prediction, start-up seconds) pairs, each that is the fastest for some run length:
    start-up + samples / rate the least. The fastest predicted first, then each with less
    start-up, for shorter runs: a short run favours a setting that starts sooner (fewer workers,
    no pinning) over one that trains faster."""
    kept: list[tuple[Prediction, float]] = []
    for prediction, start in sorted(timed, key=lambda pair: (-pair[0].samples_per_second, pair[1])):
        if not all(start < other for _, other in kept):
            continue  # as slow or slower, and as late or later
        # the last kept is fastest only between the run lengths where the one before it and
        # this one overtake it; where those cross, it never is
        while len(kept) >= 2 and crossing(
            timing(kept[-1]), (prediction.samples_per_second, start)
        ) >= crossing(timing(kept[-2]), timing(kept[-1])):
            kept.pop()
        kept.append((prediction, start))
    return kept


def crossing(faster: tuple[float, float], sooner: tuple[float, float]) -> float:
    """The samples a run must train for the faster of two settings, each (samples a second,
    start-up seconds), to overtake the one that starts sooner."""
    (fast, fast_start), (slow, slow_start) = faster, sooner
    return (fast_start - slow_start) / (1 / slow - 1 / fast)


def timing(timed: tuple[Prediction, float]) -> tuple[float, float]:
    return timed[0].samples_per_second, timed[1]


def at_batch(
    chosen: Prediction, measured: float, *, loader_rate: float, compute_rate: float
) -> dict[str, Any]:
    """`chosen` at another micro-batch, from its two rates there: the speed they predict, and the
    speed to expect, scaled as the end-to-end check found the prediction at the probe's batch
    (`measured` against `chosen`'s): what the rates apart leave out (a copy waiting for a step,
    the cores a CPU's workers share) is taken to cost the same share at every batch."""
    there = dataclasses.replace(chosen, loader_rate=loader_rate, compute_rate=compute_rate)
    return {
        "loader_rate": loader_rate,
        "compute_rate": compute_rate,
        "predicted": there.samples_per_second,
        "expected": there.samples_per_second * measured / chosen.samples_per_second,
        "bottleneck": there.bottleneck,
        "idle_share": there.idle_share,
    }


@dataclasses.dataclass(frozen=True)
class Payback:
    """A cost paid once a run (torch.compile's) against the time it saves each sample after."""

    once_seconds: float  # its start-up beyond the setting's without it
    speed: float  # samples a second of the setting without it, predicted
    faster: float  # ... and with it

    @property
    def samples(self) -> float | None:
        """Samples after which the run has won it back; None: never (it saves nothing)."""
        saved = 1.0 / self.speed - 1.0 / self.faster
        return max(0.0, self.once_seconds) / saved if saved > 0 else None

    def pays_within(self, samples: float) -> bool:
        return self.samples is not None and self.samples <= samples


def payback(chosen: Prediction, *, compute_rate: float, once_seconds: float) -> Payback:
    """What compiling `chosen` costs and saves, at its loader: a faster step on an input-bound
    setting saves nothing."""
    faster = dataclasses.replace(chosen, compute_rate=compute_rate)
    return Payback(once_seconds, chosen.samples_per_second, faster.samples_per_second)


def checkpointing_fit(
    space: Space,
    peaks: Sequence[int | None],
    *,
    batch: int,
    device_bytes: int | None,
    set_bytes: int = 0,
) -> dict[str, Any] | None:
    """Where checkpointing is a choice with off among it: the space's largest micro-batch's
    predicted peak without it (the hungriest of `peaks`, each a setting's step at `batch` as
    measured, plus `set_bytes`, the training set's copy where the trials keep one on the device),
    beside the device's memory, and whether it fits (devices.FITS_SHARE). None where it is no
    choice, or a peak is missing (None: a setting out of memory at `batch`, or failed)."""
    values = space["checkpointing"].values
    if len(values) < 2 or False not in values or not peaks or not all(peaks) or not device_bytes:
        return None
    sizes = space["batch_size"]
    largest_batch = int(max(sizes.values) if isinstance(sizes, Choices) else sizes.high)
    predicted = max(peaks) * max(1.0, largest_batch / batch) + set_bytes
    return {
        "largest_batch": largest_batch,
        "predicted_bytes": round(predicted),
        "device_bytes": device_bytes,
        "fits": predicted <= FITS_SHARE * device_bytes,
        **({"set_bytes": set_bytes} if set_bytes else {}),
    }


def loader_settings(loaders: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each (num_workers, pin_memory) of `loaders` once, fewest workers first, at the largest
    prefetch_factor among them (a loader read alone runs at one rate whatever its prefetch:
    nothing lets a queue build, and in a run more prefetch only absorbs the step's jitter); the
    training set on the device, where among them, first: it has no workers, and however fast the
    workers before it delivered, it may start sooner and leave the cores free."""
    most: dict[tuple[bool, int, bool], dict[str, Any]] = {}
    for setting in loaders:
        on_device = loader_of(setting)["data_on_device"]
        key = (not on_device, setting["num_workers"], setting["pin_memory"])
        if most.get(key) is None or (setting["prefetch_factor"] or 0) > (
            most[key]["prefetch_factor"] or 0
        ):
            most[key] = setting
    return [most[key] for key in sorted(most)]


def compute_settings(space: Space) -> list[dict[str, Any]]:
    """Every precision x format of the space (TF32 only with fp32: formats_for)."""
    return [
        {"precision": p, **f}
        for p in space["precision"].values
        for f in formats_for(space, p, MEASURED_FORMATS)
    ]
