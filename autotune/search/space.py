"""The knobs, the values each accepts, and a study's search space over them.

A space gives every knob a domain: a numeric range or a list of choices (a fixed value is a
list of one). Beside the knobs it may hold the user's own parameters (model width, dropout,
weight decay, ...): the same kinds of domain, an integer range when both bounds are whole
numbers. `suggest` turns a space into one configuration through an Optuna trial, which it only
duck-types, so this module does not import Optuna. What one knob accepts, and the precision
table, are search/knob.py's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any, Protocol

from autotune.search.knob import DDP_KNOBS, PRECISIONS, Knob

SCHEDULERS = ("constant", "step", "cosine", "onecycle")


KNOBS: dict[str, Knob] = {
    knob.name: knob
    for knob in (
        Knob(
            "lr", float, 0.0, doc="peak learning rate of one optimizer step (per effective batch)"
        ),
        Knob(
            "scheduler", str, names=SCHEDULERS, doc="LR schedule, stepped once per optimizer step"
        ),
        Knob("batch_size", int, 1, doc="micro-batch: samples per forward/backward; drives memory"),
        Knob("accumulation_steps", int, 1, doc="micro-batches per optimizer step"),
        Knob(
            "data_on_device",
            bool,
            doc="the training set kept on the device and batched there, with no DataLoader "
            "(tasks that offer it); the loader knobs then do not apply",
            absent=False,
        ),
        Knob("num_workers", int, 0, doc="DataLoader worker processes; 0 loads in the main process"),
        Knob(
            "prefetch_factor", int, 1, doc="batches each worker loads ahead; needs num_workers > 0"
        ),
        Knob(
            "pin_memory", bool, doc="page-locked host buffers and non_blocking copies (CUDA only)"
        ),
        Knob(
            "precision",
            str,
            names=tuple(PRECISIONS),
            doc="fp32, fp16 (autocast + GradScaler), bf16",
        ),
        Knob(
            "schedule_epochs",
            float,
            0.0,
            doc="length of the LR schedule in epochs; at most the budget's max_epochs",
        ),
        Knob(
            "channels_last",
            bool,
            doc="model and 4-D input batches in channels-last memory format",
            absent=False,
        ),
        Knob(
            "compile",
            bool,
            doc="torch.compile the model; compile time counts on the training clock",
            absent=False,
        ),
        Knob(
            "cudnn_benchmark",
            bool,
            doc="cuDNN searches the fastest convolution algorithms for fixed shapes (CUDA only)",
            absent=False,
        ),
        Knob(
            "tf32",
            bool,
            doc="float32 matrix products on TF32 tensor cores "
            "(torch.set_float32_matmul_precision('high'); CUDA, compute capability 8.0 or more)",
            absent=False,
        ),
        Knob(
            "fused_optimizer",
            bool,
            doc="the optimizer's fused step: one kernel for every parameter, where the task's "
            "optimizer has one",
            absent=False,
        ),
        Knob(
            "checkpointing",
            bool,
            doc="activation checkpointing of the model's checkpoint_blocks(): true all, a "
            "fraction the first share of them; recomputed in the backward pass",
            absent=False,
            shares=True,
        ),
        *DDP_KNOBS.values(),
    )
}

# Knobs that change speed and memory, never what a step computes (float noise aside): the
# DataLoader's (or none, the training set batched on the device), and the memory format,
# compilation, cuDNN's search, TF32 matrix products (a 10-bit mantissa inside float32 products,
# accumulated in float32), the fused optimizer step and activation checkpointing (the same
# forward again, in the backward pass).
LOADER_KNOBS = ("data_on_device", "num_workers", "prefetch_factor", "pin_memory")
# The loader knobs of a setting that has no DataLoader: data_on_device.
NO_LOADER: dict[str, Any] = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False}
FORMAT_KNOBS = (
    "channels_last",
    "compile",
    "cudnn_benchmark",
    "tf32",
    "fused_optimizer",
    "checkpointing",
)


def formats_for(
    space: Space, precision: str, knobs: tuple[str, ...] = FORMAT_KNOBS
) -> list[dict[str, Any]]:
    """Every combination of the space's values of the format `knobs` for `precision`, TF32 on only
    with fp32 (unless the space fixes it on): under autocast the matrix products run in the
    narrower type whatever it says, so both of its values would measure alike."""
    combos = [
        dict(zip(knobs, values)) for values in itertools.product(*(space[k].values for k in knobs))
    ]
    both = "tf32" in knobs and False in space["tf32"].values
    return [c for c in combos if not (both and c["tf32"] and precision != "fp32")]


# Optional in presets and study files: without one, the schedule is the budget's max_epochs
# (time_to_target) or a range up to it (fixed_schedule, spec/study_file.py).
SCHEDULE = "schedule_epochs"

# What a hand-written training script typically uses; the study's speedup is measured against it.
DEFAULT_BASELINE: dict[str, Any] = {
    "lr": 0.01,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "data_on_device": False,
    "num_workers": 0,
    "prefetch_factor": None,
    "pin_memory": False,
    "precision": "fp32",
    "schedule_epochs": None,  # the budget's max_epochs (spec/space_section.baseline)
    "channels_last": False,
    "compile": False,
    "cudnn_benchmark": False,
    "tf32": False,
    "fused_optimizer": False,
    "checkpointing": False,
    **{knob.name: knob.absent for knob in DDP_KNOBS.values()},  # DistributedDataParallel's own
}


@dataclasses.dataclass(frozen=True)
class Range:
    """Numbers from `low` to `high` inclusive, sampled on a log scale when `log`."""

    low: float
    high: float
    log: bool = False


@dataclasses.dataclass(frozen=True)
class Choices:
    """A fixed list of values; a list of one is a fixed knob."""

    values: tuple[Any, ...]


Domain = Range | Choices


# Names the external-command task fills in beside the configuration; a parameter cannot take one.
RESERVED = ("seed", "device", "max_epochs", "eval_every", "config_file")


@dataclasses.dataclass(frozen=True)
class Space:
    """A domain for every knob, in the order of KNOBS, and for each of the user's own parameters."""

    domains: tuple[tuple[str, Domain], ...]
    params: tuple[tuple[str, Domain], ...] = ()

    def __getitem__(self, name: str) -> Domain:
        return dict(self.domains)[name]

    def replace(self, name: str, domain: Domain) -> Space:
        return dataclasses.replace(
            self, domains=tuple((k, domain if k == name else d) for k, d in self.domains)
        )

    def fixed(self) -> dict[str, Any]:
        """The knobs that take one value, with that value."""
        return {
            k: d.values[0] for k, d in self.domains if isinstance(d, Choices) and len(d.values) == 1
        }


class Suggester(Protocol):
    """The part of `optuna.trial.Trial` that `suggest` uses."""

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...

    def suggest_int(self, name: str, low: int, high: int, *, log: bool = False) -> int: ...

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


def is_integer(name: str, domain: Range) -> bool:
    """A knob's range takes the knob's type; a parameter's is whole numbers when both bounds are."""
    if name in KNOBS:
        return KNOBS[name].type is int
    return all(isinstance(b, int) and not isinstance(b, bool) for b in (domain.low, domain.high))


def suggest(space: Space, trial: Suggester) -> dict[str, Any]:
    """One configuration: every knob, then every parameter, sampled where the space leaves a
    choice."""
    config: dict[str, Any] = {}
    for name, domain in (*space.domains, *space.params):
        if name in LOADER_KNOBS and config.get("data_on_device"):
            # Conditional: without a DataLoader its knobs do not exist (loader.DeviceLoader).
            config[name] = NO_LOADER[name]
        elif name == "prefetch_factor" and config["num_workers"] == 0:
            # Conditional parameter: it does not exist without worker processes.
            config[name] = None
        elif isinstance(domain, Choices):
            values = domain.values
            config[name] = (
                values[0] if len(values) == 1 else trial.suggest_categorical(name, values)
            )
        elif is_integer(name, domain):
            config[name] = trial.suggest_int(
                name, int(domain.low), int(domain.high), log=domain.log
            )
        else:
            config[name] = trial.suggest_float(name, domain.low, domain.high, log=domain.log)
    return config


def middle(name: str, domain: Domain) -> Any:
    """A parameter's baseline when the study file gives none: the first choice, or the middle of
    the range (on a log scale for a log range)."""
    if isinstance(domain, Choices):
        return domain.values[0]
    low, high = domain.low, domain.high
    value = math.sqrt(low * high) if domain.log else (low + high) / 2
    return round(value) if is_integer(name, domain) else value


def every_value(domain: Domain) -> list[Any]:
    """Every value of a domain: a choice's values, or each whole number of a range of whole
    numbers (the micro-batch and the loader knobs)."""
    if isinstance(domain, Choices):
        return list(domain.values)
    return list(range(int(domain.low), int(domain.high) + 1))


def filled(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every knob of `config`. One it lacks (a study begun before the knob existed, or a stored
    None for a knob its trial lacked) holds what leaving it out meant, Knob.absent: the one place
    a configuration is filled in so."""
    return {
        name: config[name] if config.get(name) is not None else KNOBS[name].absent for name in KNOBS
    }


def loader_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The loader knobs of `config` (a configuration, or a stored loader setting): data_on_device
    off where it is left out, as it was before it was a knob."""
    return {k: config[k] if k in config else KNOBS[k].absent for k in LOADER_KNOBS}


def absent_domain(name: str) -> Choices | None:
    """The domain of a knob a study or preset leaves out: the one value leaving it out means;
    None for a knob that must be given."""
    absent = KNOBS[name].absent
    return None if absent is None else Choices((absent,))


def complete(config: Mapping[str, Any]) -> dict[str, Any]:
    """A full configuration from stored params: conditional knobs filled in as `suggest` would,
    the user's parameters after the knobs."""
    full = filled(config)
    if full["data_on_device"]:
        full.update(NO_LOADER)
    if full["num_workers"] == 0:
        full["prefetch_factor"] = None
    return {**full, **{name: value for name, value in config.items() if name not in KNOBS}}
