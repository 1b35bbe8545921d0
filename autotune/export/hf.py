"""`--format hf`: JSON with `training_arguments`, ready for

    transformers.TrainingArguments(output_dir=..., **export["training_arguments"])

beside the user's parameters that are not TrainingArguments fields (`params`) and a note for
every setting TrainingArguments cannot take or takes only approximately (`notes`).
Written for transformers 5 (warmup_steps as a fraction; 4.x calls that warmup_ratio). compile
is `torch_compile`, tf32 `tf32` and checkpointing `activation_checkpointing`; channels_last,
cudnn_benchmark and fused_optimizer have no field, so their notes say what to do; on several
devices DistributedDataParallel's knobs go as export/ddp.py says.
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
from autotune.export.hf_schedule import lr_schedule, schedule_length
from autotune.record.summary import Summary
from autotune.search.knob import PRECISIONS
from autotune.search.recipe import SGD_ARGS, loader_kwargs

# TrainingArguments fields for the optimizer HF builds; a user's parameter of that name goes there
# when the task's optimizer took it (the built-in SGD takes none: they went to the model).
OPTIMIZER_FIELDS = ("weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")


def systems_notes(knobs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Notes for channels_last and cudnn_benchmark, which TrainingArguments has no field for (noted
    whatever their value: a note for every setting it cannot take), and for what torch_compile
    does beyond compiling."""
    if knobs["channels_last"]:
        layout = (
            "TrainingArguments has no memory-format field. "
            "autotune laid the model out channels-last "
            "and moved each 4-D input batch (N, C, H, W) as torch.channels_last: "
            "do model = model.to(memory_format=torch.channels_last) "
            "before transformers.Trainer(model=model, ...), "
            "and have your data_collator return each 4-D input tensor as "
            "t.contiguous(memory_format=torch.channels_last) "
            "(the Trainer's copy to the device keeps the layout)."
        )
    else:
        layout = (
            "TrainingArguments has no memory-format field; "
            "autotune trained the model and its inputs in the default (contiguous) memory format, "
            "as HF does: convert neither to channels-last."
        )
    if knobs["cudnn_benchmark"]:
        search = (
            "TrainingArguments has no field for cuDNN's algorithm search; "
            "autotune set torch.backends.cudnn.benchmark = True for the trial: "
            "set it before trainer.train() (it holds for the whole process)."
        )
    else:
        search = (
            "TrainingArguments has no field for cuDNN's algorithm search; "
            "autotune ran with torch.backends.cudnn.benchmark = False, torch's default: "
            "leave it so."
        )
    notes = [
        note("channels_last", knobs["channels_last"], NO_EQUIVALENT, layout),
        note("cudnn_benchmark", knobs["cudnn_benchmark"], NO_EQUIVALENT, search),
    ]
    # transformers turns TF32 on with torch_compile unless fp16 (TrainingArguments.__post_init__),
    # and accelerate again for fp32 (AcceleratorState, on CUDA). tf32=False is no fix: it turns TF32
    # off for cuDNN convolutions too, which torch's default, and so the trial, allowed.
    if knobs["compile"] and knobs["precision"] != "fp16" and not knobs["tf32"]:
        notes.append(
            note(
                "compile",
                True,
                APPROXIMATION,
                "torch_compile compiles the model as autotune did "
                "(torch.compile, backend inductor, default mode; "
                "compile time on the training clock). "
                "But on an NVIDIA GPU with TF32 (Ampere or newer), transformers turns TF32 on "
                "for float32 matmuls "
                "when it builds TrainingArguments(torch_compile=True) without fp16, "
                "and accelerate does again when transformers.Trainer is built for fp32; "
                "autotune's trial kept torch's default, full-precision float32 matmuls. "
                "To train as it did, after building the Trainer: "
                "torch.backends.fp32_precision = 'none'; "
                "torch.set_float32_matmul_precision('highest') (the first for torch 2.9 or later).",
            )
        )
    return notes


def render(summary: Summary) -> str:
    knobs, params = knobs_and_params(summary)
    args: dict[str, Any] = {
        "per_device_train_batch_size": knobs["batch_size"],
        "gradient_accumulation_steps": knobs["accumulation_steps"],
        "learning_rate": knobs["lr"],
    }
    notes: list[dict[str, Any]] = []
    for part in (
        lr_schedule(knobs),
        schedule_length(knobs, max_epochs(summary)),
        _systems(knobs, summary.device),
        _optimizer(summary, knobs, params),
    ):
        args.update(part[0])
        notes += part[1]
    extras = params_note(params, "TrainingArguments")
    if extras:
        notes.append(extras)
    if summary.devices_per_trial != 1:
        # the Trainer runs DDP when launched as several processes: the backend the trial used
        args["ddp_backend"] = "gloo" if summary.device == "cpu" else "nccl"
        notes += devices_note(summary)
    ddp_fields, ddp_notes = ddp.hf(summary, knobs)
    args.update(ddp_fields)
    notes += ddp_notes
    export = {
        "source": provenance(summary),
        "training_arguments": args,
        "params": params,
        "notes": notes,
    }
    return json.dumps(export, indent=2) + "\n"


def _systems(knobs: Mapping[str, Any], device: str | None) -> Part:
    """Precision, the loader, compilation, clipping and the device."""
    # HF's fp16 is autocast + GradScaler, as autotune's
    flag = lookup("hf", "precision", knobs["precision"], PRECISIONS).hf
    args: dict[str, Any] = {p.hf: p.hf == flag for p in PRECISIONS.values() if p.hf}
    loader = loader_kwargs(knobs)
    args.update(
        {
            f"dataloader_{k}": loader[k]
            for k in (
                "num_workers",
                "prefetch_factor",
                "pin_memory",
                "persistent_workers",
                "drop_last",
            )
            if k in loader
        }
    )
    notes = [threads_note(knobs), data_on_device_note(knobs, "transformers.Trainer")]
    # backend inductor, default mode: autotune's torch.compile(model)
    args["torch_compile"] = knobs["compile"]
    # Off, tf32 is left out: TrainingArguments then keeps torch's default, as the trial did
    # (tf32=False would turn TF32 off for cuDNN's convolutions too, which torch's default allows).
    if knobs["tf32"]:
        # TF32 matmuls; cuDNN's convolutions allow TF32 already by torch's default, as in
        # the trial
        args["tf32"] = True
    notes += systems_notes(knobs)
    checkpointing, checkpointing_note = _checkpointing(knobs["checkpointing"])
    args.update(checkpointing)
    notes.append(checkpointing_note)
    args["max_grad_norm"] = 0.0  # HF clips gradients at 1.0 by default; autotune does not clip
    if device == "cpu":
        # the study ran on CPU; TrainingArguments refuses bf16 without a GPU unless told so
        args["use_cpu"] = True
    elif device is None:
        notes.append(
            note(
                "device",
                None,
                NO_EQUIVALENT,
                "the study did not record its device; when you train on CPU, "
                "add use_cpu=True "
                "(TrainingArguments refuses bf16 on a machine without a GPU otherwise).",
            )
        )
    return args, notes


def _checkpointing(value: bool | float) -> tuple[dict[str, Any], dict[str, Any]]:
    """activation_checkpointing (transformers 4.x: gradient_checkpointing), non-reentrant as
    autotune's, and the note on what HF checkpoints."""
    if not value:
        return {"activation_checkpointing": False}, note(
            "checkpointing",
            value,
            MOVED,
            "autotune kept every activation for the backward pass: activation_checkpointing false.",
        )
    share = "every block" if value is True else f"the first {value:g} of the blocks"
    return {
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"use_reentrant": False},
    }, note(
        "checkpointing",
        value,
        APPROXIMATION,
        f"autotune checkpointed {share} of model.checkpoint_blocks() "
        "(torch.utils.checkpoint, use_reentrant=False). activation_checkpointing "
        "(gradient_checkpointing in transformers 4.x) makes transformers.Trainer call "
        "model.activation_checkpointing_enable(), which checkpoints every layer of a "
        "transformers model; a model without that method needs activation_checkpointing left "
        f"out and autotune.train.checkpointing.apply(model, {value!r}) before "
        "transformers.Trainer(model=model, ...).",
    )


def _optimizer(summary: Summary, knobs: Mapping[str, Any], params: dict[str, Any]) -> Part:
    """The optimizer: the built-in SGD as optim sgd; else a note, with the user's optimizer
    parameters that TrainingArguments names moved out of `params` into it."""
    if built_in_optimizer(summary):
        return _sgd(summary, knobs)
    args: dict[str, Any] = {}
    notes = [
        optimizer_note(
            summary,
            knobs["lr"],
            trainer="TrainingArguments(optim=)",
            fused=knobs["fused_optimizer"],
            then=(
                "pass transformers.Trainer(optimizers=(optimizer, None)): "
                "HF still builds the LR schedule, "
                "and its own optim (left at the default, AdamW) goes unused"
            ),
        )
    ]
    for name in [k for k in params if k in OPTIMIZER_FIELDS]:
        args[name] = params.pop(name)
        notes.append(
            note(
                name,
                args[name],
                MOVED,
                f"your parameter {name}, "
                f"set as TrainingArguments.{name} for the optimizer HF builds; "
                f"when you pass your own optimizer instead, "
                f"give it {name}={args[name]!r} as autotune did.",
            )
        )
    return args, notes


def _sgd(summary: Summary, knobs: Mapping[str, Any]) -> Part:
    """autotune's built-in SGD as optim sgd, with notes on where HF's SGD differs."""
    momentum, nesterov, decay = (
        SGD_ARGS["momentum"],
        SGD_ARGS["nesterov"],
        SGD_ARGS["weight_decay"],
    )
    args: dict[str, Any] = {
        "optim": "sgd",
        "optim_args": f"momentum={momentum},nesterov={nesterov}",
        "weight_decay": decay,
    }
    notes = [
        note(
            "optimizer",
            summary.optimizer,
            APPROXIMATION,
            f"autotune's SGD(lr, momentum={momentum}, nesterov={nesterov}, "
            f"weight_decay={decay}) as optim sgd; "
            "HF applies weight_decay to every parameter except biases and norm-layer weights, "
            "autotune to all of them.",
        )
    ]
    if knobs["fused_optimizer"]:
        notes.append(
            note(
                "fused_optimizer",
                True,
                NO_EQUIVALENT,
                "optim sgd builds torch.optim.SGD without fused=True. To step as autotune did, "
                f"build torch.optim.SGD(model.parameters(), lr={knobs['lr']!r}, "
                f"momentum={momentum}, nesterov={nesterov}, weight_decay={decay}, fused=True) "
                "and pass transformers.Trainer(optimizers=(optimizer, None)).",
            )
        )
    return args, notes
