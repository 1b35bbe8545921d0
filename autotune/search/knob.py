"""What one knob accepts (`Knob`), what each value of the precision knob means to each layer
and trainer (`PRECISIONS`), and the knobs DistributedDataParallel takes (`DDP_KNOBS`).
search/space.py's KNOBS is the table of knobs made of them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Precision:
    """One value of the precision knob as each layer and trainer names it."""

    dtype: str  # autocast's torch dtype, by name (torch.<dtype>): this layer imports no torch
    # per activation value: memory grows with it (oom_boundary); the widest is the probe's reference
    bytes: int
    lightning: str  # lightning.Trainer(precision=)
    # the transformers.TrainingArguments flag it sets true; None: neither fp16 nor bf16
    hf: str | None
    autocast: bool  # forward passes (training and evaluation) run under torch.autocast(dtype)
    # the loss is scaled (torch.amp.GradScaler): fp16's small gradients would underflow
    grad_scaler: bool


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(
        "float32", 4, lightning="32-true", hf=None, autocast=False, grad_scaler=False
    ),
    "fp16": Precision(
        "float16", 2, lightning="16-mixed", hf="fp16", autocast=True, grad_scaler=True
    ),
    "bf16": Precision(
        "bfloat16", 2, lightning="bf16-mixed", hf="bf16", autocast=True, grad_scaler=False
    ),
}


@dataclasses.dataclass(frozen=True)
class Knob:
    """What one knob accepts: its type, its smallest value, or its fixed set of names."""

    name: str
    type: type
    minimum: float | None = None
    names: tuple[str, ...] | None = None
    doc: str = ""
    # An on/off knob that also takes a share strictly between 0 and 1 (of the model's blocks):
    # 0 and 1 are read as false and true, so a value has one spelling.
    shares: bool = False
    # What a configuration stored before the knob existed meant by leaving it out: the trial ran
    # without it (None: nothing to assume, or the schedule's default of max_epochs).
    absent: Any = None

    @property
    def numeric(self) -> bool:
        return self.type in (int, float)

    def check(self, value: Any) -> str | None:
        """Return None if `value` is acceptable, else a phrase saying what is accepted."""
        if self.type is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and finite(value)
            ok = ok and value > (self.minimum or 0.0)
            return (
                None
                if ok
                else f"{self.name} takes a finite number greater than {self.minimum or 0}"
            )
        if self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= self.minimum
            return None if ok else f"{self.name} takes a whole number of at least {self.minimum}"
        if self.type is bool and self.shares:
            ok = isinstance(value, bool) or (
                isinstance(value, (int, float)) and finite(value) and 0 <= value <= 1
            )
            return None if ok else f"{self.name} takes true, false or a fraction between 0 and 1"
        if self.type is bool:
            return None if isinstance(value, bool) else f"{self.name} takes true or false"
        if value in self.names:
            return None
        return f"{self.name} takes one of {', '.join(self.names)}"

    def normal(self, value: Any) -> Any:
        """A checked value in its one spelling: a share of 0 or 1 as false or true, any other as a
        float."""
        if self.shares and not isinstance(value, bool):
            return value == 1 if value in (0, 1) else float(value)
        return value


# DistributedDataParallel's keyword for each knob it takes: how a trial's ranks bucket and
# all-reduce gradients, never what a step computes. Each knob's absent value is DDP's own default,
# so a study that leaves them out trains as DDP does unasked; one device has nothing to all-reduce.
DDP_KNOBS: dict[str, Knob] = {
    "bucket_cap_mb": Knob(
        "ddp_bucket_cap_mb",
        int,
        1,
        doc="MB of gradients per DDP all-reduce bucket (several devices only)",
        absent=25,
    ),
    "gradient_as_bucket_view": Knob(
        "ddp_gradient_as_bucket_view",
        bool,
        doc="gradients as views into DDP's buckets: no copy, less memory (several devices only)",
        absent=False,
    ),
    "static_graph": Knob(
        "ddp_static_graph",
        bool,
        doc="DDP told that the graph and the parameters used are the same every step "
        "(several devices only)",
        absent=False,
    ),
}

DDP_NAMES = tuple(knob.name for knob in DDP_KNOBS.values())


def ddp_args(config: Mapping[str, Any]) -> dict[str, Any]:
    """DistributedDataParallel's keyword arguments from a full configuration's knobs."""
    return {arg: config[knob.name] for arg, knob in DDP_KNOBS.items()}


def share(value: bool | float | None) -> float:
    """The fraction a shares knob's value stands for: false (or a knob left out) 0, true 1."""
    return float(value or 0)


def finite(value: float) -> bool:
    """True for a number that fits a float and is not inf or NaN."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False
