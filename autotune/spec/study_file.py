"""The study file: read once, validated strictly, frozen.

Every mistake raises `SpecError` naming the file, the key, the value it got and what would be
accepted. The `space` and `baseline` sections are read in space_section.py, the target, budget
and confirm sections in sections.py, a command task in command_task.py, the storage URL in
storage_url.py; checks.py holds the checks the sections share, and parses the YAML.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.search.space import Space
from autotune.spec import command_task, sections, space_section
from autotune.spec.checks import read_yaml, reject_unknown, require, whole_number
from autotune.spec.command_task import CommandTask
from autotune.spec.sections import Budget, Confirm, Target
from autotune.spec.storage_url import storage_url

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


# The objectives, what a trial's time is. time_to_target: a run stops at the first evaluation
# that reaches the target, its time is the time to get there. fixed_schedule (airbench): a run
# always trains its whole schedule, its time is the schedule's, and it is feasible when the mean
# final metric over its seeds reaches the target. goodput: a run stops at the target, as under
# time_to_target, and its time is predicted from the samples it needed and the fastest systems
# setting for its maths in the probe's table. systems_only: the baseline's maths, only the systems
# settings searched. record/objectives.py and probe/model/goodput.py hold the rules.
TIME_TO_TARGET, FIXED_SCHEDULE, GOODPUT, SYSTEMS_ONLY = (
    "time_to_target",
    "fixed_schedule",
    "goodput",
    "systems_only",
)
OBJECTIVES = (TIME_TO_TARGET, FIXED_SCHEDULE, GOODPUT, SYSTEMS_ONLY)


@dataclasses.dataclass(frozen=True)
class StudySpec:
    path: Path
    name: str
    task: str | CommandTask  # a built-in task name or package.module:callable, or a command
    target: Target
    space: Space
    budget: Budget
    storage: str
    seed: int
    device: str
    baseline: tuple[tuple[str, Any], ...]
    confirm: Confirm
    # auto, process (a child process per trial) or none (trials in the study's process)
    isolation: str
    # stop a trial once its training clock passes the best time to target; none
    prune: str = "incumbent"
    # joint: the systems settings chosen together from rates measured apart, before the trials
    # (probe/run.py); none
    probe: str = "joint"
    objective: str = TIME_TO_TARGET  # what a trial's time is (OBJECTIVES)
    replicates: int = 1  # seeds per trial; its time is their mean (study/objective.py)
    # prior: a new study's first few trials are a larger batch, a scaled lr and an annealing
    # schedule (search/prior.py); baseline: its first trial is the baseline (where it lies in the
    # space); sampled: the sampler chooses every trial
    first_trial: str = "prior"
    # processes (one device each) a trial trains on, with DistributedDataParallel
    devices_per_trial: int = 1


TOP_KEYS = (
    "name",
    "task",
    "target",
    "space",
    "budget",
    "storage",
    "seed",
    "device",
    "baseline",
    "confirm",
    "isolation",
    "prune",
    "probe",
    "objective",
    "replicates",
    "first_trial",
    "devices_per_trial",
)
MAX_DEVICES_PER_TRIAL = 64
REPLICATES_DEFAULT = {TIME_TO_TARGET: 1, FIXED_SCHEDULE: 2, GOODPUT: 1, SYSTEMS_ONLY: 1}
PRUNE_MODES = ("none", "incumbent")
PROBE_MODES = ("joint", "none")
# an earlier engine's name, still read in the study files that name it: the joint probe measures
OLD_PROBE = "systems"
# the path of a study given to autotune.tune(): there is no file
PYTHON_API = Path("autotune.tune()")
# Every seed a study derives from its own (trials', the sampler's, the confirmation's) fits the
# 32-bit seeds numpy and Optuna's samplers take, and the 64-bit ones torch takes.
MAX_SEED = 2**31 - 1
FIRST_TRIAL_MODES = ("sampled", "baseline", "prior")
ISOLATION_MODES = ("auto", "process", "warm", "none")


def options(spec: StudySpec) -> tuple[str, str]:
    """How the user gives the study a new name, and how they allow changes to it: the study file's
    key and the command line's option, or tune()'s arguments."""
    if spec.path == PYTHON_API:
        return "name (tune()'s name=)", "call tune() again with allow_changes=True"
    return "name (the study file's name: key)", "run with --allow-changes"


def load(
    path: str | Path,
    *,
    storage: str | None = None,
    isolation: str | None = None,
    trials: int | None = None,
    timeout: float | None = None,
) -> StudySpec:
    """Read and validate a study file. The command line's `storage`, `isolation`, `trials` and
    `timeout` (--storage, --isolation, --trials, --timeout), where given, replace the file's."""
    path = Path(path)
    spec = from_mapping(read_yaml(path), path=path, storage=storage, isolation=isolation)
    budget = dataclasses.replace(
        spec.budget,
        **{k: v for k, v in (("trials", trials), ("timeout", timeout)) if v is not None},
    )
    return dataclasses.replace(spec, budget=budget)


# The one-word settings: key -> (accepted values, default, what each means).
MODES = {
    "isolation": (
        ISOLATION_MODES,
        "auto",
        "auto (a child process per trial on CUDA, none on CPU), "
        "process (a fresh child per trial), "
        "warm (a child kept between trials, replaced after a failure or a leak) or none",
    ),
    "prune": (
        PRUNE_MODES,
        "incumbent",
        "incumbent (stop a trial once its training time passes the best time to target so far) "
        "or none",
    ),
    "probe": (
        PROBE_MODES,
        "joint",
        "joint (choose DataLoader settings, precision and memory format together from the "
        "loader's and the compute's rates, measured apart) or none",
    ),
    "first_trial": (
        FIRST_TRIAL_MODES,
        "prior",
        "prior (a new study's first trials use the largest batch with enough steps an epoch, the "
        "baseline's lr scaled to it and an annealing schedule), sampled (the sampler chooses "
        "every trial) or baseline (a new study's first trial is the baseline, so the search "
        "starts from a known time)",
    ),
    "objective": (
        OBJECTIVES,
        TIME_TO_TARGET,
        "time_to_target (stop each run at the target; its time is the time to get there), "
        "fixed_schedule (run each whole schedule, feasible when the mean final metric over seeds "
        "reaches the target), "
        "goodput (the samples each run needs to reach the target, timed by the fastest systems "
        "setting measured apart) or systems_only (the baseline's maths; only settings that leave "
        "its training unchanged are searched)",
    ),
}


def _mode(path: Path, raw: Mapping[str, Any], key: str, *, given: str | None = None) -> str:
    choices, default, meaning = MODES[key]
    value = given if given is not None else raw.get(key, default)
    if key == "probe" and value == OLD_PROBE:
        return "joint"
    require(path, key, value, value in choices, meaning)
    return value


def from_mapping(
    raw: Any, *, path: Path, storage: str | None = None, isolation: str | None = None
) -> StudySpec:
    """Validate a study given as a mapping (a study file's contents, or `autotune.tune`'s
    arguments); `path` names it in errors and places the default storage beside it."""
    _check_top_level(path, raw)
    name, task, seed, device = (
        _name(path, raw),
        _task(path, raw),
        whole_number(path, raw, "seed", default=0, low=0, high=MAX_SEED),
        _device(path, raw),
    )
    isolation = _mode(path, raw, "isolation", given=isolation)
    prune, probe, objective, first_trial = (
        _mode(path, raw, key) for key in ("prune", "probe", "objective", "first_trial")
    )
    replicates = whole_number(
        path,
        raw,
        "replicates",
        default=REPLICATES_DEFAULT[objective],
        low=1,
        high=20,
        what=": the seeds each trial runs",
    )
    devices_per_trial = whole_number(
        path,
        raw,
        "devices_per_trial",
        default=1,
        low=1,
        high=MAX_DEVICES_PER_TRIAL,
        what=": the devices (one process each) a trial trains on",
    )
    if objective in (GOODPUT, SYSTEMS_ONLY) and probe == "none":
        require(
            path,
            "probe",
            probe,
            False,
            f"joint with objective: {objective}, whose trials are timed from the probe's table",
        )
    storage = storage_url(path, storage if storage is not None else raw.get("storage"))

    budget = sections.budget(path, raw.get("budget", {}))
    _check_objective_runs(path, objective, task)
    space = space_section.space(
        path,
        raw.get("space", {}),
        max_epochs=budget.max_epochs,
        fixed_schedule=objective == FIXED_SCHEDULE,
    )
    return StudySpec(
        path=path,
        name=name,
        task=task if isinstance(task, str) else command_task.command_task(path, task, space),
        target=sections.target(path, raw["target"]),
        space=space,
        budget=budget,
        storage=storage,
        seed=seed,
        device=device,
        baseline=space_section.baseline(
            path, raw.get("baseline", {}), space, max_epochs=budget.max_epochs
        ),
        confirm=sections.confirm(path, raw.get("confirm", {})),
        isolation=isolation,
        prune=prune,
        probe=probe,
        objective=objective,
        replicates=replicates,
        first_trial=first_trial,
        devices_per_trial=devices_per_trial,
    )


def _check_top_level(path: Path, raw: Any) -> None:
    """A mapping of known keys, with the ones every study needs."""
    if not isinstance(raw, Mapping):
        raise SpecError(
            path,
            "(top level)",
            raw,
            "a study file is a mapping of keys such as task, target, space, budget",
        )
    reject_unknown(path, "", raw, TOP_KEYS)
    for key in ("task", "target"):
        if key not in raw:
            raise SpecError(path, key, None, f"{key} is required")


def _name(path: Path, raw: Mapping[str, Any]) -> str:
    name = raw.get("name", path.stem)
    require(
        path,
        "name",
        name,
        isinstance(name, str) and name.strip() != "" and name.isprintable(),
        "a non-empty string of printable characters (no NUL, tab or newline)",
    )
    return name


def _task(path: Path, raw: Mapping[str, Any]) -> str | Mapping[str, Any]:
    """The task as given: a name, or the mapping command_task() reads once the space is."""
    task = raw["task"]
    require(
        path,
        "task",
        task,
        (isinstance(task, str) and task.strip() != "") or isinstance(task, Mapping),
        "a built-in task name, package.module:callable, or a mapping {command: ...}",
    )
    return task


def _device(path: Path, raw: Mapping[str, Any]) -> str:
    device = raw.get("device", "auto")
    require(
        path,
        "device",
        device,
        isinstance(device, str) and DEVICE_PATTERN.fullmatch(device) is not None,
        "auto, cpu, cuda or cuda:N",
    )
    return device


def _check_objective_runs(path: Path, objective: str, task: str | Mapping[str, Any]) -> None:
    """Every objective but time_to_target needs a training autotune runs, which a command is not."""
    if objective != TIME_TO_TARGET and isinstance(task, Mapping):
        raise SpecError(
            path,
            "objective",
            objective,
            "time_to_target for a command task, which stops itself at the "
            f"target; {objective} needs a built-in or Python task, whose training autotune runs",
        )
