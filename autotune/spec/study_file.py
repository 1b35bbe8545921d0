"""The study file: read once, validated strictly, frozen.

Every mistake raises `SpecError` naming the file, the key, the value it got and what would be
accepted. The `space` and `baseline` sections are read in space_section.py; checks.py holds the
checks the sections share, and parses the YAML.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import SpecError
from autotune.search.space import KNOBS, Space
from autotune.spec import command_line, space_section
from autotune.spec.checks import is_int, mapping, number, read_yaml, reject_unknown, require

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
# sqlite: one process (the default); journal: Optuna's journal file, for several local workers;
# postgresql/mysql: a database server, for workers on several machines.
STORAGE_SCHEMES = ("sqlite", "journal", "postgresql", "mysql")


# The objectives, what a trial's time is. time_to_target: a run stops at the first evaluation
# that reaches the target, its time is the time to get there. fixed_schedule (airbench): a run
# always trains its whole schedule, its time is the schedule's, and it is feasible when the mean
# final metric over its seeds reaches the target. goodput: a run stops at the target, as under
# time_to_target, and its time is predicted from the samples it needed and the throughput phase's
# fastest systems setting for its maths. systems_only: the baseline's maths, only the systems
# settings searched. study/objective.py and search/goodput.py hold the rules.
TIME_TO_TARGET, FIXED_SCHEDULE, GOODPUT, SYSTEMS_ONLY = (
    "time_to_target",
    "fixed_schedule",
    "goodput",
    "systems_only",
)
OBJECTIVES = (TIME_TO_TARGET, FIXED_SCHEDULE, GOODPUT, SYSTEMS_ONLY)


@dataclasses.dataclass(frozen=True)
class Target:
    metric: str  # name of the task's validation metric, e.g. "accuracy"
    value: float  # the trial is feasible once the metric reaches this


@dataclasses.dataclass(frozen=True)
class Budget:
    trials: int  # finished trials in the storage, across every run of the study
    timeout: float | None  # seconds for this invocation of `autotune run`; None: no limit
    max_epochs: (
        float  # per trial; the longest LR schedule (space.schedule_epochs), and the default one
    )
    max_seconds: float  # per trial, on the training clock
    eval_every: (
        float  # epochs between evaluations: often enough that the clock stops near the crossing
    )
    trial_timeout: float  # wall seconds after which a trial in a child process is killed as hung
    trial_timeout_given: bool = (
        False  # set in the file, not the default: worth a notice where it cannot apply
    )


@dataclasses.dataclass(frozen=True)
class Confirm:
    top: int  # best trials re-run on fresh seeds before the winner is named
    runs: int  # fresh seeds per confirmed configuration, and for the baseline
    baseline: str = "all"  # all: the baseline on every seed; until_resolved: until it is told apart (confirm.py)
    precision: bool = False  # beside the fastest trial in a narrower precision, its maths in fp32: samples to target compared


@dataclasses.dataclass(frozen=True)
class CommandTask:
    """A training command run once per trial, in the study file's folder (autotune/runners/command.py)."""

    command: str | tuple[str, ...]  # a string is split like a shell would; never run through one
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables, placeholders allowed

    def describe(self) -> dict[str, Any]:
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "env": dict(self.env),
        }


Task = str | CommandTask  # str: a built-in task name or package.module:callable


@dataclasses.dataclass(frozen=True)
class StudySpec:
    path: Path
    name: str
    task: Task
    target: Target
    space: Space
    budget: Budget
    storage: str
    seed: int
    device: str
    baseline: tuple[tuple[str, Any], ...]
    confirm: Confirm
    isolation: (
        str  # auto, process (a child process per trial) or none (trials in the study's process)
    )
    prune: str = (
        "incumbent"  # stop a trial once its training clock passes the best time to target; none
    )
    probe: str = "systems"  # systems: settle loader knobs, then precision, by short runs (search/probe.py); joint:
    # both together from rates measured apart (study/roofline_probe.py); none
    objective: str = TIME_TO_TARGET  # what a trial's time is (OBJECTIVES)
    replicates: int = 1  # seeds per trial; its time is their mean (study/objective.py)
    first_trial: str = "sampled"  # baseline: a new study's first trial is the baseline (where it lies in the space);
    # prior: its first few trials are a larger batch, a scaled lr and an annealing schedule (search/prior.py)


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
)
REPLICATES_DEFAULT = {TIME_TO_TARGET: 1, FIXED_SCHEDULE: 2, GOODPUT: 1, SYSTEMS_ONLY: 1}
PRUNE_MODES = ("none", "incumbent")
PROBE_MODES = ("systems", "joint", "none")
ACCURACY = "accuracy"  # a fraction of the validation set, by every route
PYTHON_API = Path(
    "autotune.tune()"
)  # the path of a study given to autotune.tune(): there is no file
# Every seed a study derives from its own (trials', the sampler's, the confirmation's) fits the
# 32-bit seeds numpy and Optuna's samplers take, and the 64-bit ones torch takes.
MAX_SEED = 2**31 - 1
FIRST_TRIAL_MODES = ("sampled", "baseline", "prior")
ISOLATION_MODES = ("auto", "process", "warm", "none")
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
CONFIRM_DEFAULTS = {"top": 3, "runs": 3, "baseline": "all", "precision": False}
CONFIRM_BASELINE = ("all", "until_resolved")


def options(spec: StudySpec) -> tuple[str, str]:
    """How the user gives the study a new name, and how they allow changes to it: the study file's
    key and the command line's option, or tune()'s arguments."""
    if spec.path == PYTHON_API:
        return "name=", "call tune() again with allow_changes=True"
    return "name:", "run with --allow-changes"


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
        "auto (a child process per trial on CUDA, none on CPU), process (a fresh child per trial), warm (a child kept between trials, replaced after a failure or a leak) or none",
    ),
    "prune": (
        PRUNE_MODES,
        "incumbent",
        "incumbent (stop a trial once its training time passes the best time to target so far) or none",
    ),
    "probe": (
        PROBE_MODES,
        "systems",
        "systems (settle DataLoader settings, then precision, by short runs before the search), "
        "joint (choose them together from the loader's and the compute's rates, measured apart) or none",
    ),
    "first_trial": (
        FIRST_TRIAL_MODES,
        "sampled",
        "sampled (the sampler chooses every trial), baseline (a new "
        "study's first trial is the baseline, so the search starts from a known time) or prior (a new "
        "study's first trials use the largest batch with enough steps an epoch, the baseline's lr scaled "
        "to it and an annealing schedule)",
    ),
    "objective": (
        OBJECTIVES,
        TIME_TO_TARGET,
        "time_to_target (stop each run at the target; its time is the time to get there), "
        "fixed_schedule (run each whole schedule, feasible when the mean final metric over seeds reaches the target), "
        "goodput (the samples each run needs to reach the target, timed by the fastest systems setting measured "
        "apart) or systems_only (the baseline's maths; only settings that leave its training unchanged are searched)",
    ),
}


def _mode(path: Path, raw: Mapping[str, Any], key: str, *, given: str | None = None) -> str:
    choices, default, meaning = MODES[key]
    value = given if given is not None else raw.get(key, default)
    require(path, key, value, value in choices, meaning)
    return value


def _storage(path: Path, storage: Any) -> str:
    """The storage URL; by default a SQLite file beside the study file, named after it."""
    if storage is None:
        storage = f"sqlite:///{path.resolve().parent / (path.stem + '.db')}"
    scheme = storage.split("://", 1)[0].split("+", 1)[0] if isinstance(storage, str) else None
    require(
        path,
        "storage",
        storage,
        scheme in STORAGE_SCHEMES and "://" in storage,
        "a storage URL: sqlite:///study.db (one process), journal:///study.journal (several local workers) "
        "or postgresql://user@host/db (several machines)",
    )
    if scheme in ("sqlite", "journal"):
        file = storage.split(":///", 1)[1] if ":///" in storage else ""
        require(
            path,
            "storage",
            storage,
            file not in ("", ":memory:") and not file.startswith("?"),
            f"a file to keep the study in, as {scheme}:///study.{'db' if scheme == 'sqlite' else 'journal'} "
            f"(an in-memory database would end with the run, and the study could not resume)",
        )
    return storage


def from_mapping(
    raw: Any, *, path: Path, storage: str | None = None, isolation: str | None = None
) -> StudySpec:
    """Validate a study given as a mapping (a study file's contents, or `autotune.tune`'s
    arguments); `path` names it in errors and places the default storage beside it."""
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

    name = raw.get("name", path.stem)
    require(
        path,
        "name",
        name,
        isinstance(name, str) and name.strip() != "" and name.isprintable(),
        "a non-empty string of printable characters (no NUL, tab or newline)",
    )
    task = raw["task"]
    require(
        path,
        "task",
        task,
        (isinstance(task, str) and task.strip() != "") or isinstance(task, Mapping),
        "a built-in task name, package.module:callable, or a mapping {command: ...}",
    )
    seed = raw.get("seed", 0)
    require(
        path,
        "seed",
        seed,
        is_int(seed) and 0 <= seed <= MAX_SEED,
        f"a whole number from 0 to {MAX_SEED}",
    )
    device = raw.get("device", "auto")
    require(
        path,
        "device",
        device,
        isinstance(device, str) and DEVICE_PATTERN.fullmatch(device) is not None,
        "auto, cpu, cuda or cuda:N",
    )
    isolation = _mode(path, raw, "isolation", given=isolation)
    prune, probe, objective, first_trial = (
        _mode(path, raw, key) for key in ("prune", "probe", "objective", "first_trial")
    )
    replicates = raw.get("replicates", REPLICATES_DEFAULT[objective])
    require(
        path,
        "replicates",
        replicates,
        is_int(replicates) and 1 <= replicates <= 20,
        "a whole number from 1 to 20: the seeds each trial runs",
    )
    storage = _storage(path, storage if storage is not None else raw.get("storage"))

    budget = _budget(path, raw.get("budget", {}))
    if objective != TIME_TO_TARGET and isinstance(task, Mapping):
        raise SpecError(
            path,
            "objective",
            objective,
            "time_to_target for a command task, which stops itself at the "
            f"target; {objective} needs a built-in or Python task, whose training autotune runs",
        )
    space = space_section.space(
        path,
        raw.get("space", {}),
        max_epochs=budget.max_epochs,
        fixed_schedule=objective == FIXED_SCHEDULE,
    )
    return StudySpec(
        path=path,
        name=name,
        task=task if isinstance(task, str) else _command_task(path, task, space),
        target=_target(path, raw["target"]),
        space=space,
        budget=budget,
        storage=storage,
        seed=seed,
        device=device,
        baseline=space_section.baseline(
            path, raw.get("baseline", {}), space, max_epochs=budget.max_epochs
        ),
        confirm=_confirm(path, raw.get("confirm", {})),
        isolation=isolation,
        prune=prune,
        probe=probe,
        objective=objective,
        replicates=replicates,
        first_trial=first_trial,
    )


def _command_task(path: Path, raw: Mapping[str, Any], space: Space) -> CommandTask:
    """`task: {command: ..., env: {...}}`: its placeholders must name knobs, parameters or the
    names the runner fills, and its program must exist, before any trial runs."""
    reject_unknown(path, "task.", raw, ("command", "env"))
    command = raw.get("command")
    if isinstance(command, list) and all(isinstance(arg, str) for arg in command) and command:
        command = tuple(command)
    require(
        path,
        "task.command",
        command,
        (isinstance(command, str) and command.strip() != "") or isinstance(command, tuple),
        "a command line (a string, or a list of its arguments) with {knob} placeholders",
    )
    env = raw.get("env") or {}
    require(
        path,
        "task.env",
        env,
        isinstance(env, Mapping),
        "a mapping of environment variable names to values",
    )
    for key, value in env.items():
        # What the operating system takes as a variable's name and value: no '=' in a name, no NUL anywhere.
        require(
            path,
            f"task.env.{key}",
            key,
            isinstance(key, str) and key != "" and "=" not in key and "\0" not in key,
            "a variable's name: text without '=' or NUL",
        )
        require(
            path,
            f"task.env.{key}",
            value,
            isinstance(value, (str, int, float))
            and not isinstance(value, bool)
            and "\0" not in str(value),
            "a string or a number (with no NUL character)",
        )
    env = {key: str(value) for key, value in env.items()}
    for key, value in env.items():  # a placeholder is named where it is written
        try:
            command_line.validate((value,), known=[*KNOBS, *dict(space.params)], cwd=None)
        except ValueError as exc:
            raise SpecError(
                path, f"task.env.{key}", value, str(exc).replace("the command names", "it names")
            ) from None
    try:
        command_line.validate(
            command, known=[*KNOBS, *dict(space.params)], cwd=path.resolve().parent
        )
    except ValueError as exc:
        raise SpecError(
            path, "task.command", command if isinstance(command, str) else list(command), str(exc)
        ) from None
    return CommandTask(command=command, env=tuple(env.items()))


def _target(path: Path, raw: Any) -> Target:
    raw = mapping(path, "target", raw, ("metric", "value"))
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
    return Target(metric=metric, value=value)


def _budget(path: Path, raw: Any) -> Budget:
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


def _confirm(path: Path, raw: Any) -> Confirm:
    raw = {**CONFIRM_DEFAULTS, **mapping(path, "confirm", raw, tuple(CONFIRM_DEFAULTS))}
    for key in ("top", "runs"):  # each run is a whole training run: a hundred is hours already
        require(
            path,
            f"confirm.{key}",
            raw[key],
            is_int(raw[key]) and 0 <= raw[key] <= MAX_CONFIRM,
            f"a whole number from 0 to {MAX_CONFIRM}",
        )
    require(
        path,
        "confirm.baseline",
        raw["baseline"],
        raw["baseline"] in CONFIRM_BASELINE,
        "all (the baseline on every fresh seed) or until_resolved (on at least two, then only until its runs "
        "are told apart from every candidate's)",
    )
    require(
        path,
        "confirm.precision",
        raw["precision"],
        isinstance(raw["precision"], bool),
        "true (also run the fastest trial's maths in fp32 where its precision is narrower, on the same seeds, "
        "and compare the samples each needed to reach the target) or false",
    )
    return Confirm(
        top=raw["top"], runs=raw["runs"], baseline=raw["baseline"], precision=raw["precision"]
    )
