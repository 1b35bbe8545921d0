"""A process's first steps on a device, taken once and untimed before any setting or trial is
timed.

A process's first steps load what every later one reuses (on a GPU the CUDA libraries' handles
and their first kernels: 1 s on an H200, where a later step of the same kind started in 0.1 s).
That is the process's cost, not a configuration's: timed, it would land on whichever setting
happened to be measured first (and a setting's start-up decides which runs it wins:
probe/model/roofline.py), and on every trial in a fresh process but on no trial in a warm one. So a
measurement takes them first (`take_once`, which also keeps what they took beyond the same steps
taken again, as a figure of its own) and so does a trial, before its clock starts
(`take_before`). What only a narrower precision, cuDNN's search or a fused step loads still
lands on the first such setting measured, and on a trial of it in a fresh process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from autotune.train import oom
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import Task
from autotune.train.training import build

_taken: set[str] = set()  # the devices whose first steps this process has taken
FIRST_STEPS = 3  # a backward and an optimizer step load theirs only once a forward has run


def plain(config: TrialConfig) -> TrialConfig:
    """`config`'s step at fp32 in no special format: what every other step loads too."""
    return dataclasses.replace(
        config,
        precision="fp32",
        channels_last=False,
        cudnn_benchmark=False,
        tf32=False,
        fused_optimizer=False,
        compile=False,
    )


def take_once(device: torch.device, session: Callable[[], Any]) -> float | None:
    """Build `session()` (a plain step that takes a few steps; its `startup_seconds` timed, its
    `close()`) twice, unless this process has on `device`: the first build's start-up beyond the
    second's is what the process's first steps loaded, returned. None where this process has
    taken them, or a step ran out of memory (tried once: it would again, and the settings' own
    sessions meet that limit, each a result)."""
    if str(device) in _taken:
        return None
    _taken.add(str(device))
    try:
        first, later = (_start_up(session()) for _ in range(2))
        return max(0.0, first - later)
    except Exception as exc:
        if not oom.is_oom(exc):
            raise
    oom.free_memory()  # out of the handler: the failed step's tensors went with the exception
    return None


def load_much(device: torch.device) -> bool:
    """Whether a process's first steps on `device` load enough to keep off a trial's clock: on a
    GPU, CUDA's libraries and first kernels (1 s on an H200, against trials of seconds). On a CPU
    next to nothing, and taking them would run the task's own code (its model, its data, whatever
    they do besides) again for nothing."""
    return device.type == "cuda"


def take_before(
    task: Task, config: TrialConfig, *, limits: Limits, device: torch.device, seed: int
) -> None:
    """A trial's process's first steps, before its clock starts: a few plain steps of its task at
    its micro-batch, with no loader workers, unless this process has taken them on `device` or
    they load little there (`load_much`). A step out of memory leaves them untaken, for a later
    trial at a smaller batch to take (this one meets that limit itself, as a result)."""
    if str(device) in _taken or not load_much(device):
        return
    steps = dataclasses.replace(
        plain(config), num_workers=0, prefetch_factor=None, pin_memory=False, accumulation_steps=1
    )
    try:
        _plain_steps(task, steps, limits=limits, device=device, seed=seed)
    except Exception as exc:
        if not oom.is_oom(exc):
            raise
    else:
        _taken.add(str(device))
    # out of the handler, the steps' model and batch gone with their frame: the trial's memory
    # and peak are its own
    oom.free_memory()


def _plain_steps(
    task: Task, config: TrialConfig, *, limits: Limits, device: torch.device, seed: int
) -> None:
    training = build(task, config, limits=limits, device=device, seed=seed)
    batch = next(iter(training.loader), None)  # None: a batch larger than the data, which the
    if batch is not None:  # trial itself refuses
        losses = [training.step([batch]) for _ in range(FIRST_STEPS)]
        float(losses[-1])  # waits for the device


def _start_up(session: Any) -> float:
    session.close()
    return session.startup_seconds
