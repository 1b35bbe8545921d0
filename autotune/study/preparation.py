"""Preparing a run: the study file's task, space and baseline fitted to the device and checked
before any training, and checked again against the stored study (as begun, unchanged).

Every mistake a user can make surfaces here, before the storage is written.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from autotune import progress
from autotune.errors import SpecError
from autotune.record import definition, objectives
from autotune.runners import command, descendants, distributed, isolation, modes
from autotune.search import devices
from autotune.search.space import KNOBS, Choices, Space
from autotune.spec.command_task import CommandTask
from autotune.spec.storage_url import logs_folder
from autotune.spec.study_file import GOODPUT, SYSTEMS_ONLY, StudySpec
from autotune.study import feasibility
from autotune.train import checkpointing, systems, telemetry
from autotune.train.config import Limits
from autotune.train.loader import on_device_problem
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
    # the probe's measurements, where the task is autotune's to train on one device
    measure: isolation.Measure | None = None
    end_measuring: Callable[[], None] | None = None  # once measuring is done, before any trial
    batch_norm: bool = False  # the task's model has BatchNorm: its micro-batch is part of the maths

    @property
    def train_samples(self) -> int | None:
        """The task's training samples; None where autotune does not train it (a command, an
        objective)."""
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
    """Resolve the device, build the task and fit the space to the device; all errors are the
    user's.

    `task` or `objective` (from the Python API) stand in for the study's task name; either one
    runs in this process, since a child process cannot rebuild an object by name.
    """
    device = resolve_device(spec)
    in_memory = task is not None or objective is not None
    notices = _check_devices_per_trial(spec, device, in_memory=in_memory)
    if not isinstance(spec.task, CommandTask) and objective is None:
        task = task if task is not None else load_task(spec.task, study_path=spec.path)
        feasibility.check_datasets(spec, task)
    space, baseline, fitted = fit_to_device(spec, device, task)
    notices += fitted
    knobs = tuple(KNOBS)
    if isinstance(spec.task, CommandTask):
        knobs = spec.task.knobs_read()
        space, baseline, unread = _unread_fixed(space, baseline, knobs)
        notices += unread
    if task is not None and objective is None:
        feasibility.check_task(spec, space, task)
        space = feasibility.check_feasible(spec, space, baseline, task, notices)
    prepared = functools.partial(
        Prepared,
        device=device,
        space=space,
        baseline=baseline,
        notices=notices,
        definition=definition.for_spec(spec, space=space, device=device.type),
    )
    if isinstance(spec.task, CommandTask):  # runs in a process of its own whatever `isolation` says
        return prepared(task=None, isolation="process", run_trial=_command_trial(spec), knobs=knobs)
    if in_memory:
        _check_in_memory(spec, objective=objective)
    if objective is not None:
        return prepared(task=None, isolation="none", run_trial=objective)
    if spec.devices_per_trial > 1:
        run_trial = distributed.on_devices(
            spec.task,
            study_path=spec.path,
            hang_after=spec.budget.trial_timeout,
            devices=spec.devices_per_trial,
        )
        return prepared(task=task, isolation="process", run_trial=run_trial)
    mode = "none" if in_memory else isolation.resolve(spec.isolation, device)
    if mode == "none" and spec.budget.trial_timeout_given:
        where = "a task given as a Python object" if in_memory else "isolation: " + spec.isolation
        notices.append(
            f"budget.trial_timeout ({spec.budget.trial_timeout:g} s) does not apply: trials run "
            f"in this process ({where}), where a hung trial cannot be stopped; isolation: warm or "
            f"process runs each in a child that can be"
        )
    runners = modes.for_mode(
        mode,
        spec.task,
        task,
        study_path=spec.path,
        trial_timeout=spec.budget.trial_timeout,
        notice=progress.tell,
    )
    return prepared(
        task=task,
        isolation=mode,
        run_trial=runners.run_trial,
        measure=runners.measure,
        end_measuring=runners.end_measuring,
        batch_norm=spec.objective in (GOODPUT, SYSTEMS_ONLY) and _has_batch_norm(task, baseline),
    )


def _check_devices_per_trial(
    spec: StudySpec, device: torch.device, *, in_memory: bool
) -> list[str]:
    """A trial on several devices runs in one fresh process per device (autotune's training, or
    the command under torch.distributed's launcher): what cannot is refused, and the isolation it
    replaces is said; its notices."""
    devices = spec.devices_per_trial
    if devices == 1:
        return []
    refusal = None
    if in_memory:
        refusal = (
            "1 for a task or objective given as a Python object: each of a trial's processes "
            "builds the task by name"
        )
    elif spec.objective in (GOODPUT, SYSTEMS_ONLY):
        refusal = (
            f"1 with objective: {spec.objective}, whose trials are timed from the probe's "
            "table, measured on one device; time_to_target or fixed_schedule train on several"
        )
    elif device.type == "cuda":
        count = torch.cuda.device_count()
        first = device.index or 0
        if first + devices > count:
            refusal = (
                f"at most {max(count - first, 0)} on {device}: a trial takes one CUDA device per "
                f"process (cuda:{first} to cuda:{first + devices - 1}), and this machine has "
                f"{count} CUDA device{'s' if count != 1 else ''}"
            )
    if refusal is None and (problem := distributed.loopback_problem()) is not None:
        refusal = (
            f"1 here: a trial's {devices} processes meet over TCP on 127.0.0.1, which cannot be "
            f"reached ({problem}); bring the loopback interface up"
        )
    if refusal is not None:
        raise SpecError(spec.path, "devices_per_trial", devices, refusal)
    notices = []
    if spec.probe != "none" and not isinstance(spec.task, CommandTask):
        notices.append(
            f"the systems probe measures one device, so it does not run for trials on {devices}: "
            "the search samples the DataLoader settings and precision itself"
        )
    if spec.isolation in ("warm", "none") and not isinstance(spec.task, CommandTask):
        notices.append(
            f"isolation: {spec.isolation} does not apply: a trial on {devices} devices runs in "
            f"{devices} fresh child processes"
        )
    return notices


def _command_trial(spec: StudySpec) -> isolation.RunTrial:
    """What runs a trial of the study's command task."""
    assert isinstance(spec.task, CommandTask)
    return command.command_trial(
        spec.task.command,
        cwd=spec.task.folder(spec.path),
        hang_after=spec.budget.trial_timeout,
        metric_name=spec.target.metric,
        env=dict(spec.task.env),
        devices=spec.devices_per_trial,
        patterns=dict(spec.task.patterns),
        logs=logs_folder(spec.storage, spec.path, spec.name),
        written=spec.task.written_as(),
    )


def _unread_fixed(
    space: Space, baseline: dict[str, Any], knobs: tuple[str, ...]
) -> tuple[Space, dict[str, Any], list[str]]:
    """Each knob a command never names fixed at the baseline's value: searching what the script
    never receives would only add noise, and exporting it would claim it did something. One
    notice names those the space would have searched."""
    searched = []
    for name, domain in space.domains:
        if name in knobs:
            continue
        if not (isinstance(domain, Choices) and len(domain.values) == 1):
            searched.append(name)
        value = baseline[name]
        if name == "prefetch_factor" and value is None:
            value = 2  # torch's default: its trials' workers, if the script has any, get it
        space = space.replace(name, Choices((value,)))
    if not searched:
        return space, baseline, []
    return (
        space,
        baseline,
        [
            f"the command never names {', '.join('{' + k + '}' for k in searched)}: "
            "not searched and not exported (each stays at the baseline's value); name one in "
            "task.command or task.env to tune it, or {config_file} where the script reads its "
            "whole configuration"
        ],
    )


def _check_in_memory(spec: StudySpec, *, objective: isolation.RunTrial | None) -> None:
    """A task or objective given as a Python object runs in this process, and autotune measures
    the throughput only of a task whose training it runs."""
    if spec.isolation in ("process", "warm"):
        raise SpecError(
            spec.path,
            "isolation",
            spec.isolation,
            "a task or objective given as a Python object runs in this process: use none or auto",
        )
    if objective is not None and spec.objective in (GOODPUT, SYSTEMS_ONLY):
        raise SpecError(
            spec.path,
            "objective",
            spec.objective,
            "time_to_target or fixed_schedule for an objective "
            "function: autotune can measure throughput only of a task whose training it runs",
        )


def _has_batch_norm(task: Task, baseline: dict[str, Any]) -> bool:
    model = _baseline_model(task, {k: v for k, v in baseline.items() if k not in KNOBS})
    return model is not None and systems.has_batch_norm(model)


def _baseline_model(task: Task, params: dict[str, Any]) -> nn.Module | None:
    """The task's model as the baseline builds it, to look at before any trial; None where the
    factory fails (sys.exit included) or returns no nn.Module: then its trials fail, each with the
    reason recorded, as they would anyway."""
    try:
        with descendants.ended_after():  # helpers it starts are a trial's, not this look's
            model = task.model(**takes(task.model, params))
    except (Exception, SystemExit):  # noqa: BLE001 - the trials record the error
        return None
    return model if isinstance(model, nn.Module) else None


OWN_DATA = "a training command or objective function loads its own data"


def fit_to_device(
    spec: StudySpec, device: torch.device, task: Task | None
) -> tuple[Space, dict[str, Any], list[str]]:
    """The space and baseline without what this device, this install or the task's model cannot
    run (search/devices.restrict_to_device), with one notice per change; errors where nothing is
    left."""
    cuda = device.type == "cuda"
    bf16 = torch.cuda.is_bf16_supported() if cuda else True
    baseline = dict(spec.baseline)
    wanted = {
        knob
        for knob in ("compile", "channels_last", "fused_optimizer", "checkpointing")
        if any(spec.space[knob].values) or baseline[knob]
    }
    problems = {
        "compile_problem": systems.compile_problem(device) if "compile" in wanted else None,
        "tf32_problem": systems.tf32_problem(device),
        "data_on_device_problem": (
            OWN_DATA if task is None else on_device_problem(task, telemetry.memory_bytes(device))
        ),
    }
    params = {k: v for k, v in baseline.items() if k not in KNOBS}
    if {"channels_last", "checkpointing"} & wanted and task is not None:
        model = _baseline_model(task, params)
        if model is not None:
            problems["channels_last_problem"] = systems.channels_last_problem(model)
            problems["checkpointing_problem"] = checkpointing.problem(model)
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
    if spec.devices_per_trial == 1:
        space, baseline, fixed, ddp = devices.without_ddp(space, baseline)
        for knob, (value, reason) in ddp.items():
            raise SpecError(spec.path, f"space.{knob}", value, reason)
        notices += fixed
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
        minimize=spec.target.minimize,
    )


def print_notices(notices: list[str]) -> None:
    for notice in notices:
        print(f"autotune: notice: {notice}", file=sys.stderr)
