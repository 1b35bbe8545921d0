"""A trial that is a call of the user's own function (`tune(objective=...)`): the function trains
and keeps the clock, and the trial takes its word for the seconds and the metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from autotune.runners import isolation
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.search.space import KNOBS
from autotune.train.config import Limits, Progress, TrialConfig, TrialResult
from autotune.train.measure import device_name
from autotune.train.tasks import takes

# (config: dict, [seed=int], [device=torch.device]) -> (seconds, metric)
Objective = Callable[..., Any]


def as_trial(objective: Objective, *, knobs: tuple[str, ...] = tuple(KNOBS)) -> RunTrial:
    """A trial that calls the user's function with the configuration and takes its word for the
    time: `objective(config)` returns (seconds, metric) or {"seconds": ..., "metric": ...}.
    The configuration holds `knobs` and the study's parameters.

    It also gets `seed=` and `device=` if it names them. An exception (or sys.exit) fails the
    trial (an out-of-memory one prunes it), as a task's would.
    """

    def run_trial(
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        given = {k: v for k, v in config.as_dict().items() if k in knobs or k not in KNOBS}
        # sys.exit in the function ends its trial, not the study, as in a task's training
        returned = isolation.as_failure(
            lambda: objective(given, **takes(objective, {"seed": seed, "device": device}, after=1))
        )
        seconds, metric = _seconds_and_metric(returned)
        reached = limits.reached(metric)
        return TrialResult(
            reached=reached,
            time_to_target=seconds if reached else None,
            best_metric=metric,
            train_seconds=seconds,
            epochs=None,
            optimizer_steps=None,
            samples_per_second=None,
            peak_memory_bytes=None,
            device_name=device_name(device),
            torch_version=torch.__version__,
            stop_reason="target" if reached else "objective",
            curve=((seconds, None, metric),),
        )

    return run_trial


def _seconds_and_metric(returned: Any) -> tuple[float, float]:
    """The objective's answer, checked: a user's function may return anything."""
    if isinstance(returned, Mapping) and {"seconds", "metric"} <= set(returned):
        pair = (returned["seconds"], returned["metric"])
    elif isinstance(returned, (tuple, list)) and len(returned) == 2:
        pair = tuple(returned)
    else:
        raise TrialFailure(
            f"the objective returned {returned!r}; expected (seconds, metric) or "
            f"{{'seconds': ..., 'metric': ...}}"
        )
    try:
        seconds, metric = float(pair[0]), float(pair[1])
    except (TypeError, ValueError):
        raise TrialFailure(
            f"the objective returned {returned!r}; seconds and metric must be numbers"
        ) from None
    if not (math.isfinite(seconds) and seconds >= 0 and math.isfinite(metric)):
        raise TrialFailure(
            f"the objective returned {returned!r}; seconds must be >= 0 and both finite"
        )
    return seconds, metric
