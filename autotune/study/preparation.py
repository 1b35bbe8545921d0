"""Preparing a run: the study file's task, space and baseline fitted to the device and checked
before any training, and checked again against the stored study (as begun, unchanged).

Every mistake a user can make surfaces here, before the storage is written.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

import torch
from torch import nn

from autotune import progress
from autotune.errors import AutotuneError, SpecError
from autotune.record import definition, objectives, schema
from autotune.runners import command, isolation, warm
from autotune.search import devices
from autotune.search.space import KNOBS, Choices, Domain, Range, Space
from autotune.spec.sections import CommandTask
from autotune.spec.study_file import GOODPUT, SYSTEMS_ONLY, StudySpec, options
from autotune.study import storage
from autotune.train import systems
from autotune.train.config import Limits
from autotune.train.measure import cpu_count
from autotune.train.tasks import Task, load_task, takes


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a run needs beyond the spec, resolved before the storage is touched."""

    task: Task | None  # None for an objective function (autotune.tune(objective=...))
    device: torch.device
    space: Space
    baseline: dict[str, Any]
    notices: list[str]
    definition: dict[str, Any]  # what the stored trials are measured under (definition.py)
    isolation: str  # process, warm or none, as resolved for the device
    run_trial: isolation.RunTrial  # trains one configuration, here or in a child process
    knobs: tuple[str, ...] = tuple(KNOBS)  # the knobs its training reads; reports show only these
    measure: isolation.Measure | None = (
        None  # the throughput phase and the probe's rates, where the task is autotune's to train
    )
    batch_norm: bool = False  # the task's model has BatchNorm: its micro-batch is part of the maths

    @property
    def train_samples(self) -> int | None:
        """The task's training samples; None where autotune does not train it (a command, an objective)."""
        return len(self.task.train) if self.task is not None else None


def resolve_device(spec: StudySpec) -> torch.device:
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec.device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SpecError(
                spec.path,
                "device",
                spec.device,
                "no CUDA device is available here; use auto or cpu",
            )
        if (device.index or 0) >= count:
            raise SpecError(
                spec.path, "device", spec.device, f"this machine has cuda:0 to cuda:{count - 1}"
            )
    return device


def prepare(
    spec: StudySpec, *, task: Task | None = None, objective: isolation.RunTrial | None = None
) -> Prepared:
    """Resolve the device, build the task and fit the space to the device; all errors are the user's.

    `task` or `objective` (from the Python API) stand in for the study's task name; either one
    runs in this process, since a child process cannot rebuild an object by name.
    """
    device = resolve_device(spec)
    in_memory = task is not None or objective is not None
    if not isinstance(spec.task, CommandTask) and objective is None:
        task = task if task is not None else load_task(spec.task, study_path=spec.path)
        check_datasets(spec, task)
    space, baseline, notices = fit_to_device(spec, device, task)
    if task is not None and objective is None:
        check_task(spec, space, task)
        space = check_feasible(spec, space, baseline, task, notices)
    prepared = functools.partial(
        Prepared,
        device=device,
        space=space,
        baseline=baseline,
        notices=notices,
        definition=definition.describe(spec, space=space, device=device.type),
    )
    if isinstance(spec.task, CommandTask):  # runs in a process of its own whatever `isolation` says
        return prepared(
            task=None,
            isolation="process",
            run_trial=command.command_trial(
                spec.task.command,
                cwd=spec.path.resolve().parent,
                hang_after=spec.budget.trial_timeout,
                metric_name=spec.target.metric,
                env=dict(spec.task.env),
            ),
        )
    if in_memory and spec.isolation in ("process", "warm"):
        raise SpecError(
            spec.path,
            "isolation",
            spec.isolation,
            "a task or objective given as a Python object runs in this process: use none or auto",
        )
    if objective is not None:
        if spec.objective in (GOODPUT, SYSTEMS_ONLY):
            raise SpecError(
                spec.path,
                "objective",
                spec.objective,
                "time_to_target or fixed_schedule for an objective "
                "function: autotune can measure throughput only of a task whose training it runs",
            )
        return prepared(task=None, isolation="none", run_trial=objective)
    mode = "none" if in_memory else isolation.resolve(spec.isolation, device)
    if mode == "none" and spec.budget.trial_timeout_given:
        notices.append(
            f"budget.trial_timeout ({spec.budget.trial_timeout:g} s) does not apply: trials run in this process "
            f"({'a task given as a Python object' if in_memory else 'isolation: ' + spec.isolation}), where a "
            f"hung trial cannot be stopped; isolation: warm or process runs each in a child that can be"
        )
    # The phase measures every setting in one process: a trial's limit for each group of them.
    measure_hang_after = PHASE_HANG_FACTOR * spec.budget.trial_timeout
    if mode == "process":
        run_trial = isolation.in_child(
            spec.task, study_path=spec.path, hang_after=spec.budget.trial_timeout
        )
        measure = isolation.measure_in_child(
            spec.task, study_path=spec.path, hang_after=measure_hang_after
        )
    elif mode == "warm":
        kept = warm.WarmChild(
            spec.task,
            study_path=spec.path,
            hang_after=spec.budget.trial_timeout,
            measure_hang_after=measure_hang_after,
            notice=progress.tell,
        )
        run_trial, measure = kept.run_trial, kept.measure
    else:
        run_trial, measure = isolation.in_process(task), isolation.measure_in_process(task)
    return prepared(
        task=task,
        isolation=mode,
        run_trial=run_trial,
        measure=measure,
        batch_norm=spec.objective in (GOODPUT, SYSTEMS_ONLY) and _has_batch_norm(task, baseline),
    )


PHASE_HANG_FACTOR = 4  # a group of the throughput phase may take this many trials' wall-clock limit


def _has_batch_norm(task: Task, baseline: dict[str, Any]) -> bool:
    params = {k: v for k, v in baseline.items() if k not in KNOBS}
    return systems.has_batch_norm(task.model(**takes(task.model, params)))


def check_datasets(spec: StudySpec, task: Task) -> None:
    """Both sets map-style Datasets: autotune counts them (epochs, the largest batch) and samples
    them by index (seeded shuffles, the validation pass)."""
    for which, data in (("training", task.train), ("validation", task.val)):
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise SpecError(
                spec.path,
                "task",
                spec.task,
                f"the task's {which} set is {type(data).__name__}; autotune "
                f"needs a map-style Dataset (with __len__ and __getitem__), such as a TensorDataset",
            )


def check_task(spec: StudySpec, space: Space, task: Task) -> None:
    """The study's parameters and metric against what the task takes and measures."""
    for name in task.unused(dict(space.params)):
        raise SpecError(
            spec.path,
            f"space.params.{name}",
            name,
            f"neither the task's model factory nor its optimizer takes a parameter named {name}; "
            f"add {name}=... to one of their signatures (or **kwargs)",
        )
    if spec.target.metric != task.metric_name:
        raise SpecError(
            spec.path,
            "target.metric",
            spec.target.metric,
            f"task {spec.task} measures {task.metric_name!r}",
        )
    if len(task.val) == 0:  # every evaluation would fail, inside the training loop
        raise SpecError(
            spec.path,
            "task",
            spec.task,
            "the task's validation set is empty: the target is measured on it; "
            "give it at least one sample",
        )


MAX_WORKERS_PER_CORE = (
    4  # loader workers beyond this only queue for the cores (and each holds memory)
)


def largest(domain: Domain) -> Any:
    return domain.high if isinstance(domain, Range) else max(domain.values)


def smallest(domain: Domain) -> Any:
    return domain.low if isinstance(domain, Range) else min(domain.values)


def check_feasible(
    spec: StudySpec, space: Space, baseline: dict[str, Any], task: Task, notices: list[str]
) -> Space:
    """Values no trial could run with, on this machine or with this task: refused before the first
    trial instead of failing every trial that draws them, or, for batch sizes the training set
    cannot fill while smaller ones can, removed with a notice."""
    cores = (
        cpu_count()
    )  # the cores this process may use (its affinity, as a scheduler or taskset gives it)
    most = MAX_WORKERS_PER_CORE * cores
    available = f"{cores} CPU core{'s are' if cores > 1 else ' is'} available to autotune here"
    counts = space["num_workers"]
    if smallest(counts) <= most < largest(counts):
        # A study written for a bigger machine (16 workers on a GPU node) still runs on this one.
        if isinstance(counts, Choices):
            kept: Domain = Choices(tuple(w for w in counts.values if w <= most))
            removed = ", ".join(str(w) for w in counts.values if w > most)
        else:
            high = int(counts.high)
            kept, removed = (
                dataclasses.replace(counts, high=most),
                str(high) if high == most + 1 else f"{most + 1} to {high}",
            )
        notices.append(
            f"num_workers {removed} removed from the search space: {available} "
            f"(at most {MAX_WORKERS_PER_CORE} loader workers a core)"
        )
        space = space.replace("num_workers", kept)
    for key, workers in (
        ("space.num_workers", smallest(space["num_workers"])),
        ("baseline.num_workers", baseline["num_workers"]),
    ):
        if workers > most:
            raise SpecError(
                spec.path,
                key,
                workers,
                f"{available}: at most {most} loader workers ({MAX_WORKERS_PER_CORE} a core)",
            )
    samples, steps = len(task.train), smallest(space["accumulation_steps"])
    if baseline["batch_size"] * baseline["accumulation_steps"] > samples:
        raise SpecError(
            spec.path,
            "baseline.batch_size",
            baseline["batch_size"],
            f"the task has {samples} training samples: batch_size x accumulation_steps "
            f"({baseline['batch_size']} x {baseline['accumulation_steps']}) must not exceed them",
        )
    batches = space["batch_size"]
    if smallest(batches) * steps > samples:
        raise SpecError(
            spec.path,
            "space.batch_size",
            smallest(batches),
            f"the task has {samples} training samples: "
            f"batch_size x accumulation_steps ({smallest(batches)} x {steps}) must not exceed them",
        )
    if isinstance(batches, Choices) and largest(batches) * steps > samples:
        kept = tuple(b for b in batches.values if b * steps <= samples)
        notices.append(
            f"batch_size {', '.join(str(b) for b in batches.values if b not in kept)} removed from the search space: "
            f"the task has {samples} training samples"
        )
        space = space.replace("batch_size", Choices(kept))
    elif isinstance(batches, Range) and batches.high * steps > samples:
        high = samples // steps
        notices.append(
            f"batch_size {high + 1} to {batches.high:g} removed from the search space: the task has {samples} "
            f"training samples"
        )
        space = space.replace(
            "batch_size",
            dataclasses.replace(batches, high=high)
            if high > batches.low
            else Choices((int(batches.low),)),
        )
    return space


def fit_to_device(
    spec: StudySpec, device: torch.device, task: Task | None
) -> tuple[Space, dict[str, Any], list[str]]:
    """The space and baseline without what this device, this install or the task's model cannot
    run (search/devices.restrict_to_device), with one notice per change; errors where nothing is left."""
    cuda = device.type == "cuda"
    bf16 = torch.cuda.is_bf16_supported() if cuda else True
    baseline = dict(spec.baseline)
    wanted = {
        knob
        for knob in ("compile", "channels_last", "fused_optimizer")
        if True in spec.space[knob].values or baseline[knob]
    }
    problems = {
        "compile_problem": systems.compile_problem(device) if "compile" in wanted else None,
        "tf32_problem": systems.tf32_problem(device),
    }
    params = {k: v for k, v in baseline.items() if k not in KNOBS}
    if "channels_last" in wanted and task is not None:
        try:
            model = task.model(**takes(task.model, params))
        except Exception:  # noqa: BLE001 - a model that cannot be built fails its trials, where the error is recorded
            model = None
        # Nor is a factory that returns something else (a function): its trials fail, and say so.
        problems["channels_last_problem"] = (
            systems.channels_last_problem(model) if isinstance(model, nn.Module) else None
        )
    if "fused_optimizer" in wanted and task is not None:
        problems["fused_optimizer_problem"] = systems.fused_optimizer_problem(
            task.optimizer, params, device
        )
    space, notices, impossible = devices.restrict_to_device(
        spec.space, cuda=cuda, bf16=bf16, **problems
    )
    for knob, reason in impossible.items():
        raise SpecError(
            spec.path, f"space.{knob}", spec.space[knob].values, f"{reason} ({device.type})"
        )
    unsupported = devices.unsupported_precisions(cuda=cuda, bf16=bf16)
    if baseline["precision"] in unsupported:
        reason = unsupported[baseline["precision"]]
        raise SpecError(
            spec.path,
            "baseline.precision",
            baseline["precision"],
            f"{reason}; choose a precision this {device.type} device runs",
        )
    switches = devices.unsupported_switches(cuda=cuda, **problems)
    for knob, reason in switches.items():
        if baseline[knob]:
            baseline[knob] = False
            if knob != "pin_memory":  # the baseline's pinning follows the device, as it always has
                notices.append(f"baseline {knob} set to false: {reason}")
    return space, baseline, notices


def as_begun(spec: StudySpec, prepared: Prepared) -> Prepared:
    """`prepared` as the stored study began: one begun before a knob existed ran every trial
    without it and goes on so, since one Optuna study cannot add a sampled knob. Adds a notice
    for each knob it fixes. Reads the storage, so it runs after `prepare` has found every user
    error, under the runner's lock."""
    study = storage.read_study(spec)
    stored = (schema.definition(study.user_attrs) or {}).get("space") if study is not None else None
    if stored is None:
        return prepared
    space, notices = prepared.space, list(prepared.notices)
    for name, knob in KNOBS.items():
        fixed = Choices((knob.absent,))
        if knob.absent is not None and name not in stored and space[name] != fixed:
            space = space.replace(name, fixed)
            notices.append(
                f"{name} fixed to {str(knob.absent).lower()}: study {spec.name!r} began before autotune "
                f"searched it (give the study a new {options(spec)[0]} to search it)"
            )
    if space is prepared.space:
        return prepared
    return dataclasses.replace(
        prepared,
        space=space,
        notices=notices,
        definition=definition.describe(spec, space=space, device=prepared.device.type),
    )


def check_unchanged(spec: StudySpec, prepared: Prepared, *, allow_changes: bool) -> list[str]:
    """The changes to the study's definition since it began; an error unless `allow_changes`.

    Reads the storage without writing to it, so a refused run leaves it exactly as it was.
    """
    study = storage.read_study(spec)
    stored = schema.definition(study.user_attrs) if study is not None else None
    changed = definition.changes(stored, prepared.definition) if stored is not None else []
    unmixable = definition.unmixable(stored, prepared.definition) if changed else []
    if unmixable:
        raise AutotuneError(
            f"{spec.path}: the choices of {', '.join(f'space.{k}' for k in unmixable)} changed since study {spec.name!r} "
            f"began in {spec.storage} ({'; '.join(c for c in changed if c.split(':')[0].removeprefix('space.') in unmixable)}); "
            f"one Optuna study cannot mix trials over different choices: give the study a new {options(spec)[0]} "
            f"to start afresh"
        )
    if changed and not allow_changes:
        count = len(study.get_trials(deepcopy=False))
        raise AutotuneError(
            f"{spec.path}: the study file changed since study {spec.name!r} began in {spec.storage}: "
            f"{'; '.join(changed)}. The {count} trial(s) stored were measured under the old settings; "
            f"{options(spec)[1]} to add trials under the new ones, or give the study a new {options(spec)[0]}"
        )
    return changed


def limits_for(spec: StudySpec) -> Limits:
    """What every training run of the study stops at: the target (time_to_target), the end of its
    schedule or the per-trial budget."""
    b = spec.budget
    return Limits(
        target=spec.target.value,
        max_epochs=b.max_epochs,
        max_seconds=b.max_seconds,
        eval_every=b.eval_every,
        stop_at_target=objectives.of(spec.objective).stops_at_target,
    )


def print_notices(notices: list[str]) -> None:
    for notice in notices:
        print(f"autotune: notice: {notice}", file=sys.stderr)
