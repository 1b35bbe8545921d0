"""DistributedDataParallel's knobs (search/knob.DDP_KNOBS) in each trainer's terms, for a winner
trained on several devices; on one, DDP never ran and no export writes them (common.written).

Lightning takes them through a DDPStrategy object, which its trainer section (JSON) cannot hold:
at DDP's defaults the trainer keeps `strategy: "ddp"`, else a `ddp` section holds DDPStrategy's
keyword arguments and `usage` builds it. TrainingArguments has ddp_bucket_cap_mb and
ddp_static_graph fields, but none for gradient_as_bucket_view: a note says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.export.common import MOVED, NO_EQUIVALENT, note
from autotune.record.summary import Summary
from autotune.search.knob import DDP_KNOBS, ddp_args

STRATEGY = "lightning.pytorch.strategies.DDPStrategy"
TRAINER = "trainer = lightning.Trainer(**export['trainer'])"


def at_defaults(knobs: Mapping[str, Any]) -> bool:
    """Whether every DDP knob is DistributedDataParallel's own default."""
    return all(knobs[knob.name] == knob.absent for knob in DDP_KNOBS.values())


def lightning(
    summary: Summary, knobs: Mapping[str, Any], trainer: dict[str, Any]
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    """For a Trainer on several devices (`trainer` gains them and the strategy): the `ddp`
    section (None at DDP's defaults, where strategy "ddp" is the same), its notes, and the usage
    line that builds the Trainer."""
    if summary.devices_per_trial == 1 or "devices" not in trainer:  # no device: nothing to add
        return None, [], TRAINER
    trainer["devices"] = summary.devices_per_trial
    if at_defaults(knobs):
        trainer["strategy"] = "ddp"
        text = "autotune ran DistributedDataParallel's defaults, as strategy 'ddp' does."
        return None, [_note(knobs, text)], TRAINER
    section = {"class_path": STRATEGY, "init_args": ddp_args(knobs)}
    text = (
        "lightning.Trainer takes DistributedDataParallel's settings through a DDPStrategy: they "
        "are in `ddp`, for Trainer(..., strategy=DDPStrategy(**export['ddp']['init_args']))."
    )
    usage = (
        "trainer = lightning.Trainer(**export['trainer'], strategy=lightning.pytorch.strategies"
        ".DDPStrategy(**export['ddp']['init_args']))"
    )
    return section, [_note(knobs, text)], usage


def hf(summary: Summary, knobs: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """On several devices, TrainingArguments' DDP fields and gradient_as_bucket_view's note."""
    if summary.devices_per_trial == 1:
        return {}, []
    # the fields' names are the knobs'
    args = {DDP_KNOBS[a].name: knobs[DDP_KNOBS[a].name] for a in ("bucket_cap_mb", "static_graph")}
    name = DDP_KNOBS["gradient_as_bucket_view"].name
    text = "TrainingArguments has no gradient_as_bucket_view field; " + (
        "autotune ran DistributedDataParallel(gradient_as_bucket_view=True): after "
        "trainer = transformers.Trainer(...), set "
        "trainer.accelerator.ddp_handler.gradient_as_bucket_view = True before "
        "trainer.train() (the Trainer hands the handler's settings to DDP)."
        if knobs[name]
        else "autotune ran DistributedDataParallel's default (false), as the Trainer does: "
        "leave it so."
    )
    return args, [note(name, knobs[name], NO_EQUIVALENT, text)]


def torch_args(summary: Summary) -> str:
    """The generated module's keyword arguments to DistributedDataParallel, its constants: none
    for one device (DDP's defaults, should it run under a launcher)."""
    if summary.devices_per_trial == 1:
        return ""
    return ", ".join(f"{arg}={knob.name.upper()}" for arg, knob in DDP_KNOBS.items())


def _note(knobs: Mapping[str, Any], text: str) -> dict[str, Any]:
    """One note for the three, as DistributedDataParallel's keyword arguments."""
    return note(", ".join(k.name for k in DDP_KNOBS.values()), ddp_args(knobs), MOVED, text)
