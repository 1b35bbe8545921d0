"""The study file's target, budget and confirm sections: each one's frozen
dataclass, defaults and limits, and its reader. Like every check of the study file, a reader
raises `SpecError` naming the file, the key, the value it got and what would be accepted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.spec.checks import is_int, mapping, number, require

ACCURACY = "accuracy"  # a fraction of the validation set, by every route
BUDGET_DEFAULTS = {
    "trials": 20,
    "timeout": None,
    "max_epochs": 10.0,
    "max_seconds": 60.0,
    "eval_every": 0.25,
    "trial_timeout": None,
}
# The largest budget each value may take: beyond them a trial's loop would count past what floats
# and the clock's waits hold (1e308 epochs overflow; a wait longer than ~292 years is refused).
MAX_TRIALS = 1_000_000
MAX_CONFIRM = 1000  # confirm.top and confirm.runs: fresh seeds are listed, and each run trains
MAX_EPOCHS = 1_000_000.0
MAX_SECONDS = 10_000_000.0  # about 116 days
CONFIRM_DEFAULTS = {"top": 3, "runs": "auto", "baseline": "all", "precision": False}
# confirm.runs: auto: every candidate and the baseline on AUTO_FIRST_RUNS fresh seeds, then one
# more seed at a time for the leader and the baseline until the lead is resolved either way
# (record/verdict.py), up to AUTO_MAX_RUNS seeds.
AUTO_FIRST_RUNS, AUTO_MAX_RUNS = 3, 8
CONFIRM_BASELINE = ("all", "until_resolved")


def reaches(metric: float, target: float, *, minimize: bool) -> bool:
    """Whether `metric` reaches `target`: at or above it, or at or below it where lower is
    better."""
    return metric <= target if minimize else metric >= target


def shortfall(metric: float, target: float, *, minimize: bool) -> float:
    """How far `metric` is from reaching `target`: 0 or less where it reaches it (an Optuna
    constraint's sense)."""
    return metric - target if minimize else target - metric


@dataclasses.dataclass(frozen=True)
class Target:
    metric: str  # name of the task's validation metric, e.g. "accuracy"
    value: float  # the trial is feasible once the metric reaches this
    minimize: bool = False  # lower is better (a loss): reached at or below `value`

    @property
    def text(self) -> str:
        """As the report writes it: `accuracy >= 0.97`, `val_loss <= 1.7`."""
        return f"{self.metric} {'<=' if self.minimize else '>='} {self.value:g}"

    @property
    def direction(self) -> str:
        return "minimize" if self.minimize else "maximize"

    def as_record(self) -> dict[str, Any]:
        """As a study stores it (a higher-is-better target as stores made before directions)."""
        return {
            "metric": self.metric,
            "value": self.value,
            **({"minimize": True} if self.minimize else {}),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Target:
        return cls(record["metric"], record["value"], minimize=bool(record.get("minimize")))


@dataclasses.dataclass(frozen=True)
class Budget:
    trials: int  # finished trials in the storage, across every run of the study
    timeout: float | None  # seconds for this invocation of `autotune run`; None: no limit
    # per trial; the longest LR schedule (space.schedule_epochs), and the default one
    max_epochs: float
    max_seconds: float  # per trial, on the training clock
    # epochs between evaluations: often enough that the clock stops near the crossing
    eval_every: float
    trial_timeout: float  # wall seconds after which a trial in a child process is killed as hung
    # set in the file, not the default: worth a notice where it cannot apply
    trial_timeout_given: bool = False


@dataclasses.dataclass(frozen=True)
class Confirm:
    top: int  # best trials re-run on fresh seeds before the winner is named
    runs: int  # fresh seeds per confirmed configuration, and for the baseline
    # seeds the leader and the baseline may get, added until the lead is resolved (runs: auto)
    max_runs: int | None = None
    # all: the baseline on every seed; until_resolved: until it is told apart (confirm.py)
    baseline: str = "all"
    # beside the fastest trial in a narrower precision, its maths in fp32: samples to target
    # compared
    precision: bool = False


# Words that name a metric lower is better for; such a target must say its direction.
LOWER_IS_BETTER = re.compile(r"loss|err(or)?s?\b|perplexity|ppl|\b(r?mse|mae|wer|cer|nll)\b", re.I)
DIRECTIONS = ("maximize", "minimize")


def target(path: Path, raw: Any) -> Target:
    raw = mapping(path, "target", raw, ("metric", "value", "direction"))
    metric = raw.get("metric")
    require(
        path,
        "target.metric",
        metric,
        isinstance(metric, str) and metric != "",
        "the name of the task's metric, e.g. accuracy",
    )
    value = number(path, "target.value", raw.get("value"), minimum=-math.inf)
    # Whoever measures it (a task, a command, an objective function): a target no run could reach
    # would fail every trial as short of it.
    require(
        path,
        "target.value",
        value,
        metric != ACCURACY or 0 < value <= 1,
        "accuracy is a fraction: a target above 0 and at most 1",
    )
    direction = raw.get("direction")
    if direction is None and LOWER_IS_BETTER.search(metric.replace("_", " ")):
        raise SpecError(
            path,
            "target.direction",
            None,
            f"target.metric {metric!r} reads as lower is better (a loss, an error, a "
            "perplexity): add direction: minimize (reached at or below target.value), or "
            "direction: maximize where higher is better",
        )
    require(
        path,
        "target.direction",
        direction,
        direction is None or direction in DIRECTIONS,
        "maximize (reached at or above target.value, the default) or minimize (at or below)",
    )
    require(
        path,
        "target.direction",
        direction,
        not (metric == ACCURACY and direction == "minimize"),
        "maximize for accuracy: more of it is better",
    )
    return Target(metric=metric, value=value, minimize=direction == "minimize")


def budget(path: Path, raw: Any) -> Budget:
    raw = {**BUDGET_DEFAULTS, **mapping(path, "budget", raw, tuple(BUDGET_DEFAULTS))}
    trials = raw["trials"]
    require(
        path,
        "budget.trials",
        trials,
        is_int(trials) and 1 <= trials <= MAX_TRIALS,
        f"a whole number from 1 to {MAX_TRIALS:,}",
    )
    timeout = raw["timeout"]
    max_seconds = number(path, "budget.max_seconds", raw["max_seconds"], maximum=MAX_SECONDS)
    trial_timeout = raw["trial_timeout"]
    return Budget(
        trials=trials,
        timeout=None
        if timeout is None
        else number(path, "budget.timeout", timeout, maximum=MAX_SECONDS),
        max_epochs=number(path, "budget.max_epochs", raw["max_epochs"], maximum=MAX_EPOCHS),
        max_seconds=max_seconds,
        eval_every=number(path, "budget.eval_every", raw["eval_every"], maximum=MAX_EPOCHS),
        # Training stops at max_seconds; start-up and evaluations come on top, so leave room.
        trial_timeout=2 * max_seconds + 60
        if trial_timeout is None
        else number(path, "budget.trial_timeout", trial_timeout, maximum=3 * MAX_SECONDS),
        trial_timeout_given=trial_timeout is not None,
    )


def confirm(path: Path, raw: Any) -> Confirm:
    raw = {**CONFIRM_DEFAULTS, **mapping(path, "confirm", raw, tuple(CONFIRM_DEFAULTS))}
    auto = raw["runs"] == "auto"
    for key in ("top", "runs"):  # each run is a whole training run: a hundred is hours already
        require(
            path,
            f"confirm.{key}",
            raw[key],
            (key == "runs" and auto) or (is_int(raw[key]) and 0 <= raw[key] <= MAX_CONFIRM),
            f"a whole number from 0 to {MAX_CONFIRM}"
            + (
                f", or auto (seeds added to the leader and the baseline until its lead is "
                f"resolved, {AUTO_FIRST_RUNS} to {AUTO_MAX_RUNS})"
                if key == "runs"
                else ""
            ),
        )
    require(
        path,
        "confirm.baseline",
        raw["baseline"],
        raw["baseline"] in CONFIRM_BASELINE,
        "all (the baseline on every fresh seed) or until_resolved (only until its runs are "
        "told apart from every candidate's)",
    )
    require(
        path,
        "confirm.precision",
        raw["precision"],
        isinstance(raw["precision"], bool),
        "true (also run the fastest trial's maths in fp32 where its precision is narrower, "
        "on the same seeds, and compare the samples each needed to reach the target) or false",
    )
    return Confirm(
        top=raw["top"],
        runs=AUTO_FIRST_RUNS if auto else raw["runs"],
        max_runs=AUTO_MAX_RUNS if auto else None,
        baseline=raw["baseline"],
        precision=raw["precision"],
    )
