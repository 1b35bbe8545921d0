"""The Python API: tune a model and its datasets, or any training function, from a script or
notebook.

`tune` is `autotune run` without a study file: the same keys, validated the same way, the same
storage, resume and confirmation. Two routes:

- a task: `model` (a factory) with `train` and `val` datasets, or a whole `Task`; autotune runs
  the training loop, as for a study file's task;
- an objective: `objective(config)` runs the user's own loop with the configuration (a dict of
  the knobs its caller names and the study's parameters) and returns `(seconds, metric)`;
  autotune keeps the study, the budget and the winner, the function keeps the clock.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from autotune.errors import SpecError
from autotune.record.summary import Summary
from autotune.runners import user_function
from autotune.runners.user_function import Objective
from autotune.search.space import DEFAULT_BASELINE, KNOBS, SCHEDULE
from autotune.spec.study_file import FIXED_SCHEDULE, PYTHON_API
from autotune.train.tasks import Task, reference

if TYPE_CHECKING:
    import optuna

    from autotune.spec.study_file import StudySpec

WHERE = PYTHON_API  # how errors name the study: there is no file


def tune(
    *,
    target: float,
    metric: str = "accuracy",
    direction: str | None = None,
    model: Callable[..., torch.nn.Module] | None = None,
    train: Dataset | None = None,
    val: Dataset | None = None,
    task: Task | None = None,
    objective: Objective | None = None,
    name: str = "autotune",
    storage: str | None = None,
    space: Mapping[str, Any] | None = None,
    budget: Mapping[str, Any] | None = None,
    baseline: Mapping[str, Any] | None = None,
    confirm: Mapping[str, Any] | None = None,
    seed: int = 0,
    device: str = "auto",
    prune: str | None = None,
    probe: str | None = None,
    objective_kind: str | None = None,
    replicates: int | None = None,
    first_trial: str | None = None,
    allow_changes: bool = False,
) -> Summary:
    """Run (or resume) a study and return its Summary (autotune.record.summary): `.best.params`,
    `.best.time_to_target`, `.speedup`, ...; `.as_dict()` is what `autotune report --json` prints.

    Give exactly one of: `model` with `train` and `val` (accuracy on `val` is the metric), `task`,
    or `objective`. `space`, `budget`, `baseline`, `confirm`, `prune`, `probe`, `replicates`,
    `first_trial` and `objective_kind` (the study file's `objective:`, named apart from the
    function) take what the study file's keys take, `space={"params": {...}}` included; `storage`
    defaults to `sqlite:///{name}.db` in the working folder. `direction`: the study file's
    target.direction (`minimize` for a loss). Running it again with the same name and storage
    resumes the study.
    """
    from autotune.report import summarize
    from autotune.spec.study_file import from_mapping

    given = {
        "name": name,
        "target": {
            "metric": metric,
            "value": target,
            **({"direction": direction} if direction is not None else {}),
        },
        "space": space,
        "budget": budget,
        "baseline": baseline,
        "confirm": confirm,
        "seed": seed,
        "device": device,
        "prune": prune,
        "probe": probe,
        "objective": objective_kind,
        "replicates": replicates,
        "first_trial": first_trial,
    }
    _check_sections(given)
    task = _task(model=model, train=train, val=val, task=task, objective=objective)
    knobs = (
        tuple(KNOBS)
        if objective is None
        else objective_knobs(space or {}, baseline or {}, objective_kind)
    )
    function = objective if objective is not None else task.model
    raw = _study_file(given, function=function, knobs=knobs, reads_all=objective is None)
    spec = from_mapping(raw, path=WHERE, storage=storage or f"sqlite:///{name}.db")
    study = _run(spec, task=task, objective=objective, knobs=knobs, allow_changes=allow_changes)
    return summarize.of_study(spec, study)[1]


SECTIONS = ("space", "budget", "baseline", "confirm")  # the study file's keys that hold keys
# The study file's keys that tune() leaves out unless given, for the study file's defaults.
UNLESS_GIVEN = ("prune", "probe", "objective", "replicates", "first_trial")


def _check_sections(given: Mapping[str, Any]) -> None:
    """Each section tune() was given is a mapping, as in a study file."""
    for key in SECTIONS:
        value = given[key]
        if value is not None and not isinstance(value, Mapping):
            raise SpecError(WHERE, key, value, f"a mapping (a dict) of the study file's {key} keys")


def _study_file(
    given: Mapping[str, Any],
    *,
    function: Callable[..., Any],
    knobs: tuple[str, ...],
    reads_all: bool,
) -> dict[str, Any]:
    """The study file tune()'s arguments describe: the keys `given`, the task named after
    `function` (the model factory or the objective), and, unless the function `reads_all` knobs,
    each knob it does not read fixed."""
    label = (
        reference(function)
        or f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', '?')}"
    )
    space = dict(given["space"] or {})
    if not reads_all:  # what the function never reads is neither searched nor shown
        space.update(unread_fixed(knobs, given["baseline"] or {}))
    raw = {
        "name": given["name"],
        "task": f"python:{label}",
        "target": given["target"],
        "space": space,
        **{key: dict(given[key] or {}) for key in ("budget", "baseline", "confirm")},
        "seed": given["seed"],
        "device": given["device"],
    }
    raw.update({key: given[key] for key in UNLESS_GIVEN if given[key] is not None})
    return raw


def _run(
    spec: StudySpec,
    *,
    task: Task | None,
    objective: Objective | None,
    knobs: tuple[str, ...],
    allow_changes: bool,
) -> optuna.Study:
    """Prepare the study and run it; stopped, say where its trials are and how to go on."""
    from autotune import signals
    from autotune.study import preparation
    from autotune.study.run import run_sequence

    run_objective = (
        user_function.as_trial(objective, knobs=knobs) if objective is not None else None
    )
    prepared = dataclasses.replace(
        preparation.prepare(spec, task=task, objective=run_objective), knobs=knobs
    )
    try:
        return run_sequence(spec, prepared, allow_changes=allow_changes)
    except KeyboardInterrupt as interrupt:
        # Ctrl-C (or SIGTERM): the trial is marked, the storage whole
        print(
            f"autotune: interrupted ({signals.name(interrupt)}); every finished trial is saved "
            f"in {spec.storage}; call tune() again with the same name and storage to go on",
            file=sys.stderr,
        )
        raise


def _task(
    *,
    model: Callable[..., torch.nn.Module] | None,
    train: Dataset | None,
    val: Dataset | None,
    task: Task | None,
    objective: Objective | None,
) -> Task | None:
    """The task that tune() was given (None: an objective), after checking that it got exactly
    one route."""
    given = [
        route
        for route, value in (("model", model), ("task", task), ("objective", objective))
        if value is not None
    ]
    if len(given) != 1:
        raise TypeError(
            "tune() takes exactly one of model= (with train= and val=), task= or objective=, "
            f"but got {given or 'none'}"
        )
    if task is not None and not isinstance(task, Task):
        raise TypeError(
            f"tune(task=...) takes an autotune.Task, not {type(task).__name__}; a study file "
            f"names a task by its name"
        )
    for route, value in (("model", model), ("objective", objective)):
        if value is not None and not callable(value):
            what = "a model factory" if route == "model" else "a function"
            raise TypeError(
                f"tune({route}=...) takes a callable ({what} of the configuration), "
                f"not {type(value).__name__}"
            )
    if model is None:
        return task
    if train is None or val is None:
        raise TypeError("tune(model=...) also needs train= and val= datasets")
    return Task(model=model, train=train, val=val)


def objective_knobs(
    space: Mapping[str, Any], baseline: Mapping[str, Any], objective_kind: str | None
) -> tuple[str, ...]:
    """The knobs an objective function reads: those its caller names in `space` or `baseline`
    (every knob, with a preset named), and schedule_epochs under a fixed schedule, which the
    function trains for. autotune cannot see inside the function: searching what it ignores
    would only add noise to the search and settings to the report that did nothing."""
    if "preset" in space:
        return tuple(KNOBS)
    named = {*space, *baseline} | ({SCHEDULE} if objective_kind == FIXED_SCHEDULE else set())
    return tuple(k for k in KNOBS if k in named)


def unread_fixed(knobs: tuple[str, ...], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Each knob the function does not read, fixed at the baseline's value (the schedule aside:
    unsearched, it is max_epochs long)."""
    fixed = {
        k: baseline.get(k, DEFAULT_BASELINE[k]) for k in KNOBS if k not in knobs and k != SCHEDULE
    }
    if fixed.get("prefetch_factor") is None and "prefetch_factor" in fixed:
        fixed["prefetch_factor"] = 2  # torch's default; it means nothing unless num_workers is read
    return fixed
