"""A training run's result as a study stores it: the one translation from what a run gave back
(train/config.TrialResult, read by its fields) to the mappings the storage holds and the
reports read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.record import schema

if TYPE_CHECKING:  # the fields are read, nothing is built: no training machinery is loaded
    from autotune.train.config import TrialResult

# The figures every stored run has, whatever stored it; the rest is the full record's or the
# confirmation's.
TIMES = (
    "reached",
    "time_to_target",
    "best_metric",
    "train_seconds",
    "final_metric",
    "stop_reason",
    "samples_to_target",
    "paused_seconds",
)


class Point(NamedTuple):
    """One evaluation of a stored run."""

    seconds: float  # on the training clock
    epochs: float | None  # None: not counted (a command that did not say)
    metric: float
    loss: float | None  # the mean training loss since the previous evaluation; None: not stored


def points(run: Mapping[str, Any]) -> list[Point]:
    """The evaluations of a stored run (a trial's measured figures, a confirmation run), each
    with its training loss where the run stored one: a run stored before the loss was, a command
    that reports none, an objective function have none."""
    curve = run.get("curve") or []
    losses = run.get("train_loss") or []
    return [
        Point(*point[:3], losses[i] if i < len(losses) else None) for i, point in enumerate(curve)
    ]


def full(result: TrialResult) -> dict[str, Any]:
    """A trial's first run, in full: its curve and training loss, throughput, memory and
    per-class figures."""
    record = dataclasses.asdict(result)
    record["curve"] = _curve(result)
    record["final_metric"] = result.final_metric
    return record


def _curve(result: TrialResult) -> list[list[Any]]:
    """The evaluations as JSON stores them: lists, not tuples."""
    return [list(point) for point in result.curve]


def replicate(result: TrialResult, seed: int) -> dict[str, Any]:
    """One more run of a trial (a replicate), as it is stored beside the first run's full record."""
    return {"seed": seed, **{key: getattr(result, key) for key in TIMES if key != "reached"}}


def confirmation_run(result: TrialResult, *, label: str, seed: int) -> dict[str, Any]:
    """One confirmation run: its times and the figures the report compares candidates by."""
    record: dict[str, Any] = {"label": label, "seed": seed}
    record.update({key: getattr(result, key) for key in TIMES})
    record.update(
        samples_per_second=result.samples_per_second,
        input_wait_fraction=result.input_wait_fraction,
        peak_memory_bytes=result.peak_memory_bytes,
        gpu=result.gpu,
        curve=_curve(result),
        train_loss=result.train_loss,
    )
    if result.confusion is not None:  # the winner's per-class figures are pooled from these
        record["confusion"] = result.confusion
    return record


def failed_confirmation(reason: str, *, label: str, seed: int) -> dict[str, Any]:
    """A confirmation run that failed (out of memory, a hang, a crash): it did not reach the
    target."""
    return {
        "label": label,
        "seed": seed,
        "reached": False,
        "time_to_target": None,
        "best_metric": None,
        "final_metric": None,
        "reason": reason,
    }


def predicted(
    *, seconds: float, samples: float, best_metric: Any, prediction: dict[str, Any]
) -> dict[str, Any]:
    """A systems setting's result predicted from another trial's samples (systems_only): it
    reached the target in `seconds` without training."""
    return {
        "reached": True,
        "time_to_target": seconds,
        "samples_to_target": samples,
        "train_seconds": 0.0,
        "best_metric": best_metric,
        schema.PREDICTION: prediction,
    }
