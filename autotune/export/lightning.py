"""`--format lightning`: JSON whose sections splat as they are.

    trainer = lightning.Trainer(**export["trainer"])
    loader = DataLoader(train_dataset, **export["dataloader"])
    # built-in SGD
    optimizer = torch.optim.SGD(model.parameters(), **export["optimizer"]["init_args"])
    scheduler = <export["lr_scheduler"]["class_path"]>(
        optimizer, **init_args, **fractions_of_total_steps x total
    )
    return {"optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, **export["lr_scheduler"]["config"]}}

The Trainer takes no DataLoader, optimizer or scheduler settings, so those have their own
sections (the scheduler's: lightning_schedule.py), and `usage` spells out the lines above for
this winner. cudnn_benchmark is the Trainer's `benchmark`; channels_last, compile and
checkpointing are done to the model, tf32 to the process and fused_optimizer to the optimizer,
as their notes (and, when on, `usage`) say; DistributedDataParallel's knobs are export/ddp.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from autotune.export import ddp
from autotune.export.common import (
    APPROXIMATION,
    MOVED,
    NO_EQUIVALENT,
    Part,
    built_in_optimizer,
    data_on_device_note,
    devices_note,
    knobs_and_params,
    lookup,
    max_epochs,
    note,
    optimizer_note,
    params_note,
    provenance,
    threads_note,
)
from autotune.export.lightning_schedule import scheduler_section
from autotune.record.summary import Summary
from autotune.search.knob import PRECISIONS
from autotune.search.recipe import SGD_ARGS, loader_kwargs

ACCELERATOR = {"cpu": "cpu", "cuda": "gpu"}


def model_notes(knobs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What to do to the model for channels_last and compile, which lightning.Trainer cannot take.

    Noted whatever their value (common.py's rule: a note for every setting the trainer cannot
    take): false is a setting too, and a LightningModule that converts or compiles itself would
    not train as the winner did.
    """
    if knobs["channels_last"]:
        layout = (
            "lightning.Trainer has no memory-format argument. autotune laid the model out "
            "channels-last and moved each 4-D input batch (N, C, H, W) as torch.channels_last: "
            "do model = model.to(memory_format=torch.channels_last) before trainer.fit, "
            "and convert 4-D inputs on the device in your LightningModule: "
            "def on_after_batch_transfer(self, batch, dataloader_idx): inputs, targets = batch; "
            "return (inputs.contiguous(memory_format=torch.channels_last) "
            "if inputs.dim() == 4 else inputs), targets."
        )
    else:
        layout = (
            "lightning.Trainer has no memory-format argument; "
            "autotune trained the model and its inputs in the default (contiguous) memory format, "
            "as Lightning does: convert neither to channels-last."
        )
    if knobs["compile"]:
        compiled = (
            "lightning.Trainer has no compile argument. autotune trained torch.compile(model) "
            "with default arguments, its compile time on the training clock: "
            "do model = torch.compile(model), then trainer.fit(model, ...); "
            "the first steps compile, and that time counts, as in autotune. "
            "Lightning compiles validation_step too, so validation compiles a graph of its own "
            "(autotune evaluated the uncompiled module, off the clock)."
        )
    else:
        compiled = (
            "lightning.Trainer has no compile argument; "
            "autotune trained the model uncompiled, as Lightning does: don't torch.compile it."
        )
    if knobs["tf32"]:
        matmul = (
            "lightning.Trainer has no TF32 argument. "
            "autotune ran float32 matrix products on TF32 tensor cores: call "
            "torch.set_float32_matmul_precision('high') before trainer.fit (it holds for the whole "
            "process)."
        )
    else:
        matmul = (
            "lightning.Trainer has no TF32 argument; autotune ran float32 matrix products in full "
            "float32, torch's default (torch.set_float32_matmul_precision('highest')): "
            "leave it so, whatever Lightning's hint says."
        )
    if knobs["checkpointing"]:
        kept = (
            "lightning.Trainer has no activation-checkpointing argument. autotune wrapped the "
            "forward of the first blocks of model.checkpoint_blocks() in torch.utils.checkpoint "
            f"(use_reentrant=False): do autotune.train.checkpointing.apply(model, "
            f"{knobs['checkpointing']!r}) before trainer.fit."
        )
    else:
        kept = (
            "lightning.Trainer has no activation-checkpointing argument; autotune kept every "
            "activation for the backward pass, as Lightning does: checkpoint nothing."
        )
    return [
        note("channels_last", knobs["channels_last"], NO_EQUIVALENT, layout),
        note("compile", knobs["compile"], NO_EQUIVALENT, compiled),
        note("tf32", knobs["tf32"], NO_EQUIVALENT, matmul),
        note("checkpointing", knobs["checkpointing"], NO_EQUIVALENT, kept),
    ]


def render(summary: Summary) -> str:
    knobs, params = knobs_and_params(summary)
    trainer, dataloader, notes = _trainer(knobs, device=summary.device, epochs=max_epochs(summary))
    strategy, strategy_notes, make_trainer = ddp.lightning(summary, knobs, trainer)
    notes += [*devices_note(summary), *strategy_notes]
    optimizer, optimizer_notes, make_optimizer = _optimizer(summary, knobs)
    lr_scheduler, text, schedule_lines = scheduler_section(knobs["scheduler"], knobs["lr"])
    notes += [*optimizer_notes, note("scheduler", knobs["scheduler"], MOVED, text)]
    notes += [extras] if (extras := params_note(params, "lightning.Trainer")) else []
    usage = [
        make_trainer,
        "loader = torch.utils.data.DataLoader(train_dataset, **export['dataloader'])",
        *_model_usage(knobs),
        "# and in your LightningModule's configure_optimizers(self):",
        make_optimizer,
        *schedule_lines,
    ]
    export = {
        "source": provenance(summary),
        "trainer": trainer,
        **({"ddp": strategy} if strategy else {}),  # DDPStrategy's, where not DDP's defaults
        "dataloader": dataloader,
        "optimizer": optimizer,
        "lr_scheduler": lr_scheduler,
        "params": params,
        "notes": notes,
        "usage": usage,
    }
    return json.dumps(export, indent=2) + "\n"


def _model_usage(knobs: Mapping[str, Any]) -> list[str]:
    """The usage lines that do to the model and the process what lightning.Trainer cannot
    (model_notes), for the settings that are on."""
    usage = []
    if knobs["checkpointing"]:
        usage.append(
            f"autotune.train.checkpointing.apply(model, {knobs['checkpointing']!r})  "
            "# activation checkpointing of model.checkpoint_blocks()"
        )
    if knobs["channels_last"]:
        usage.append(
            "model = model.to(memory_format=torch.channels_last)  "
            "# and 4-D inputs in on_after_batch_transfer: see notes"
        )
    if knobs["compile"]:
        usage.append("model = torch.compile(model)  # then trainer.fit(model, loader)")
    if knobs["tf32"]:
        usage.append(
            "torch.set_float32_matmul_precision('high')  "
            "# TF32 tensor cores for float32 matrix products"
        )
    return usage


def _optimizer(
    summary: Summary, knobs: Mapping[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The `optimizer` section, the notes for the optimizer, fused_optimizer and lr, and the usage
    line that builds the optimizer in configure_optimizers()."""
    lr = knobs["lr"]
    optimizer: dict[str, Any] = {"factory": summary.optimizer, "lr": lr}
    notes: list[dict[str, Any]] = []
    fused = {"fused": True} if knobs["fused_optimizer"] else {}
    if built_in_optimizer(summary):
        optimizer.update(class_path="torch.optim.SGD", init_args={"lr": lr, **SGD_ARGS, **fused})
        make = "optimizer = torch.optim.SGD(self.parameters(), **export['optimizer']['init_args'])"
    else:
        notes.append(
            optimizer_note(
                summary,
                lr,
                trainer="lightning.Trainer",
                then="return it from configure_optimizers()",
                fused=knobs["fused_optimizer"],
            )
        )
        make = (
            "optimizer = <export['optimizer']['factory']>"
            "(self.parameters(), export['optimizer']['lr'], **its params"
            + (", fused=True)" if fused else ")")
        )
    notes += [
        note(
            "fused_optimizer",
            knobs["fused_optimizer"],
            MOVED,
            "lightning.Trainer has no optimizer argument: "
            + (
                "fused=True is in `optimizer`"
                if fused
                else "autotune built the optimizer without fused=True (torch's default step)"
            )
            + ".",
        ),
        note(
            "lr",
            lr,
            MOVED,
            "lightning.Trainer has no learning-rate argument: it is in `optimizer`.",
        ),
    ]
    return optimizer, notes, make


def _trainer(
    knobs: Mapping[str, Any], *, device: str | None, epochs: float | int | None
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """The Trainer's keywords, the DataLoader's, and the notes for both."""
    trainer, notes = _device(device)
    trainer["precision"] = lookup(
        "lightning", "precision", knobs["precision"], PRECISIONS
    ).lightning
    trainer["accumulate_grad_batches"] = knobs["accumulation_steps"]
    length, length_notes = _length(knobs, epochs)
    trainer.update(length)
    dataloader = loader_kwargs(knobs)
    notes += [*length_notes, *_loader_notes(knobs, dataloader), threads_note(knobs)]
    # Lightning sets torch.backends.cudnn.benchmark to it; written when false too, as the trial set
    # it false (Lightning's default, None, keeps whatever the process had).
    trainer["benchmark"] = knobs["cudnn_benchmark"]
    notes += model_notes(knobs)
    return trainer, dataloader, notes


def _device(device: str | None) -> Part:
    """accelerator and devices for the device the study trained on, or a note that it is
    unknown."""
    if device is None:
        return {}, [
            note(
                "device",
                None,
                NO_EQUIVALENT,
                "the study did not record its device; "
                "accelerator and devices are left to Lightning's defaults.",
            )
        ]
    # a trial's devices: one, or devices_per_trial (ddp.lightning)
    return {"accelerator": lookup("lightning", "device", device, ACCELERATOR), "devices": 1}, []


def _length(knobs: Mapping[str, Any], epochs: float | int | None) -> Part:
    """max_epochs, the schedule's length, where it is whole (else a note on max_steps), and how
    accumulation meets the epoch's end."""
    trainer: dict[str, Any] = {}
    notes: list[dict[str, Any]] = []
    if isinstance(epochs, int):
        trainer["max_epochs"] = epochs
    else:
        notes.append(
            note(
                "max_epochs",
                epochs,
                NO_EQUIVALENT,
                "the study's max_epochs (the length of the LR schedule) is not recorded; "
                "set Trainer(max_epochs=) to it."
                if epochs is None
                else f"Trainer(max_epochs=) takes a whole number. "
                f"Give Trainer(max_steps=floor({epochs} * len(train_dataloader) / "
                f"{knobs['accumulation_steps']})) instead (autotune's optimizer steps), "
                f"and max_epochs={int(epochs) + 1} or more.",
            )
        )
    if knobs["accumulation_steps"] > 1:
        a = knobs["accumulation_steps"]
        notes.append(
            note(
                "accumulation_steps",
                a,
                APPROXIMATION,
                f"Lightning ends every epoch with an optimizer step, over fewer than {a} "
                f"micro-batches when len(train_dataloader) is not a multiple of {a} "
                f"(their loss still divided by {a}), so it takes max_epochs * ceil(len / {a}) "
                f"steps; autotune lets an effective batch span the epoch boundary: "
                f"floor(max_epochs * len / {a}) steps. "
                f"The same when len(train_dataloader) is a multiple of {a}.",
            )
        )
    return trainer, notes


def _loader_notes(knobs: Mapping[str, Any], dataloader: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Where the loader's knobs went: `dataloader`, for the user's train_dataloader()."""
    return [data_on_device_note(knobs, "lightning.Trainer")] + [
        note(
            name,
            knobs[name],
            MOVED,
            f"lightning.Trainer has no {name} argument: it is in `dataloader`, "
            "for DataLoader(train_dataset, **export['dataloader']) in your train_dataloader()"
            + (
                "; left out there, as it only exists with num_workers > 0."
                if name not in dataloader
                else "."
            ),
        )
        for name in ("batch_size", "num_workers", "prefetch_factor", "pin_memory")
    ]
