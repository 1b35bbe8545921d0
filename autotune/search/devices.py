"""What a device (or the install, or the task's model) cannot run, and the space without it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.search.knob import DDP_KNOBS
from autotune.search.space import Choices, Range, Space

# The share of a device's memory a training run may count on: the training set's copy kept on the
# device, or the probe's predicted peak at the space's largest micro-batch, must fit within it.
FITS_SHARE = 0.8


def unsupported_precisions(*, cuda: bool, bf16: bool) -> dict[str, str]:
    """Precisions the device cannot run, each with the reason."""
    unsupported = {} if cuda else {"fp16": "needs CUDA"}
    if not bf16:
        unsupported["bf16"] = "is not supported by this device"
    return unsupported


def unsupported_switches(
    *,
    cuda: bool,
    compile_problem: str | None = None,
    channels_last_problem: str | None = None,
    tf32_problem: str | None = None,
    fused_optimizer_problem: str | None = None,
    checkpointing_problem: str | None = None,
    data_on_device_problem: str | None = None,
) -> dict[str, str]:
    """The on/off knobs that cannot be on here, each with the reason."""
    unsupported = {}
    if data_on_device_problem:
        unsupported["data_on_device"] = data_on_device_problem
    if not cuda:
        unsupported["pin_memory"] = "page-locked memory only helps CUDA copies"
        unsupported["cudnn_benchmark"] = "cuDNN runs only on CUDA"
        unsupported["tf32"] = "TF32 tensor cores are on NVIDIA GPUs only"
    if tf32_problem:
        unsupported["tf32"] = tf32_problem
    if compile_problem:
        unsupported["compile"] = compile_problem
    if channels_last_problem:
        unsupported["channels_last"] = channels_last_problem
    if fused_optimizer_problem:
        unsupported["fused_optimizer"] = fused_optimizer_problem
    if checkpointing_problem:
        unsupported["checkpointing"] = checkpointing_problem
    return unsupported


# Searched only where it can pay: on CPU a trial rarely lasts long enough to win back
# torch.compile's start-up (16 s for a three-layer CNN on 2 cores), which counts on its clock. A
# study file that fixes compile: true still compiles there.
CPU_COMPILE = (
    "on CPU, compiling takes longer than it saves in a short trial "
    "(give space.compile: true to force it)"
)
# Activation checkpointing buys memory with time: on CPU memory rarely bounds the batch, and a
# choice would only spend trials on a slower step.
CPU_CHECKPOINTING = (
    "on CPU, memory rarely bounds the batch and recomputing activations only costs time "
    "(give space.checkpointing: true to force it)"
)


def restrict_to_device(
    space: Space,
    *,
    cuda: bool,
    bf16: bool,
    compile_problem: str | None = None,
    channels_last_problem: str | None = None,
    tf32_problem: str | None = None,
    fused_optimizer_problem: str | None = None,
    checkpointing_problem: str | None = None,
    data_on_device_problem: str | None = None,
) -> tuple[Space, list[str], dict[str, str]]:
    """Remove what the device (or the install, or the task's model) cannot run.

    Returns the restricted space, one notice per change, and, for a knob whose every value was
    removed, the reason (the caller turns those into errors naming the study file).
    """
    unsupported = unsupported_precisions(cuda=cuda, bf16=bf16)
    notices: list[str] = []
    impossible: dict[str, str] = {}

    precision = space["precision"]
    kept = tuple(p for p in precision.values if p not in unsupported)
    for p in precision.values:
        if p in unsupported:
            notices.append(f"precision {p} removed from the search space: {p} {unsupported[p]}")
    if not kept:
        impossible["precision"] = "no precision in the space can run on this device"
    elif kept != precision.values:
        space = space.replace("precision", Choices(kept))

    switches = unsupported_switches(
        cuda=cuda,
        compile_problem=compile_problem,
        channels_last_problem=channels_last_problem,
        tf32_problem=tf32_problem,
        fused_optimizer_problem=fused_optimizer_problem,
        checkpointing_problem=checkpointing_problem,
        data_on_device_problem=data_on_device_problem,
    )
    if not cuda and "compile" not in switches and set(space["compile"].values) == {False, True}:
        switches["compile"] = CPU_COMPILE  # a choice only: compile: true stays
    checkpointing = space["checkpointing"].values
    if (
        not cuda
        and "checkpointing" not in switches
        and any(checkpointing)
        and not all(checkpointing)
    ):
        switches["checkpointing"] = CPU_CHECKPOINTING  # a choice only: checkpointing: true stays
    for knob, reason in switches.items():
        values = space[knob].values
        if not any(values):  # on is true, or a share of the blocks (checkpointing)
            continue
        if all(values):
            on = " or ".join(str(v).lower() for v in values)
            impossible[knob] = f"{knob}: {on} is not possible here: {reason}"
        else:
            notices.append(f"{knob} fixed to false: {reason}")
            space = space.replace(knob, Choices((False,)))
    return space, notices, impossible


# DistributedDataParallel wraps the model only on several devices: on one, its knobs change nothing.
ONE_DEVICE = "DistributedDataParallel's settings apply only with devices_per_trial > 1"


def without_ddp(
    space: Space, baseline: Mapping[str, Any]
) -> tuple[Space, dict[str, Any], list[str], dict[str, tuple[Any, str]]]:
    """A study on one device: DDP's knobs fixed to its defaults, with one notice for the space
    and one for the baseline, rather than sampled and ignored. A knob whose domain leaves out the
    default maps to its domain as written and the reason (the caller's error): a value that
    changes nothing is a mistake to point out, not to store."""
    fixed, reset, impossible, baseline = [], [], {}, dict(baseline)
    for knob in DDP_KNOBS.values():
        name, default, domain = knob.name, knob.absent, space[knob.name]
        if isinstance(domain, Range):
            inside, given = domain.low <= default <= domain.high, dataclasses.asdict(domain)
        else:
            inside, given = default in domain.values, list(domain.values)
        if not inside:
            impossible[name] = (given, f"{ONE_DEVICE}: give that, or leave {name} out")
        elif domain != Choices((default,)):
            fixed.append(f"{name} to {str(default).lower()}")
            space = space.replace(name, Choices((default,)))
        if baseline[name] != default:
            reset.append(f"{name} to {str(default).lower()}")
            baseline[name] = default
    notices = [f"{', '.join(fixed)} fixed: {ONE_DEVICE}"] if fixed else []
    notices += [f"baseline {', '.join(reset)} set: {ONE_DEVICE}"] if reset else []
    return space, baseline, notices, impossible
