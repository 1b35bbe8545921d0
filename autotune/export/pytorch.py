"""`--format torch`: a Python module in plain PyTorch that builds what the winning trial built.

The generated module defines the settings as constants, `make_training(model, train_dataset,
*, device)` (DataLoader, optimizer, LR scheduler, autocast and GradScaler, as
autotune.train.training.build builds them; the model checkpointed, channels-last and compiled as
autotune.train.systems.prepare_model makes it; cuDNN's algorithm search and TF32 set),
`to_device(inputs, device)` (autotune.train.systems.to_device) and `train_step(training,
loss_fn=...)` (one optimizer step over the accumulated micro-batches, as
autotune.train.training.train_step, then one scheduler step). It imports autotune only where the
task's own optimizer lives there, and for activation checkpointing (the same wrapping of the
model's checkpoint_blocks()); the built-in SGD is written out.
"""

from __future__ import annotations

import textwrap

from autotune.errors import AutotuneError
from autotune.export import ddp
from autotune.export.common import (
    ONECYCLE,
    built_in_optimizer,
    knobs_and_params,
    launcher,
    lookup,
    max_epochs,
    provenance,
    scheduler_code,
)
from autotune.export.pytorch_module import FACTORY, MODULE, SGD, UNKNOWN
from autotune.record.derived import current_reference
from autotune.record.summary import Summary
from autotune.search.knob import PRECISIONS
from autotune.search.recipe import SCHEDULES, SGD_ARGS, WORKER_THREADS, loader_kwargs
from autotune.search.space import KNOBS


def _optimizer(summary: Summary) -> tuple[str, str]:
    """The import line and the make_optimizer function for the task's optimizer."""
    reference = summary.optimizer
    if built_in_optimizer(summary):
        return "", SGD.substitute(
            reference=reference, sgd_args="".join(f", {k}={v!r}" for k, v in SGD_ARGS.items())
        )
    if reference is None:
        return "", UNKNOWN
    module, _, qualname = current_reference(reference).partition(":")
    if not all(part.isidentifier() for part in (*module.split("."), *qualname.split("."))):
        raise AutotuneError(
            f"--format torch: the study's optimizer {reference!r} "
            f"is not an importable module:qualname"
        )
    imports = f"\nimport {module} as _task_module  # where the task's optimizer factory lives\n"
    return imports, FACTORY.substitute(reference=reference, factory=f"_task_module.{qualname}")


def render(summary: Summary) -> str:
    knobs, params = knobs_and_params(summary)
    precision = lookup("torch", "precision", knobs["precision"], PRECISIONS)
    epochs = max_epochs(summary)
    lines = [(f"{name.upper()} = {knobs[name]!r}", KNOBS[name].doc) for name in knobs]
    lines.append(
        (
            f"MAX_EPOCHS = {epochs!r}",
            "length of the LR schedule in epochs: the winner's schedule_epochs"
            + ("; not recorded, so pass make_training(max_epochs=)" if epochs is None else ""),
        )
    )
    width = max(len(code) for code, _ in lines) + 2
    constants = "\n".join(f"{code:<{width}}# {doc}" for code, doc in lines)
    imports, make_optimizer = _optimizer(summary)
    schedule = lookup("torch", "scheduler", knobs["scheduler"], SCHEDULES)
    comment = (
        textwrap.indent(textwrap.fill(ONECYCLE + ".", 96, break_on_hyphens=False), "    # ") + "\n"
        if schedule.warmup
        else ""
    )
    # pinned on CUDA only: make_training
    loader = {k: v for k, v in loader_kwargs(knobs).items() if k != "pin_memory"}
    line = launcher(summary, "your_script.py")
    return MODULE.substitute(
        # safe in a docstring
        provenance=provenance(summary).replace("\\", "\\\\").replace('"""', '\\"""'),
        distributed_usage=(
            f"\nThe winner trained on {summary.devices_per_trial} devices: launch it as it did, "
            f"with\n\n    {line}\n\nand in each process torch.distributed.init_process_group() "
            'and device=torch.device("cuda", int(os.environ["LOCAL_RANK"])).\n'
            if line
            else ""
        ),
        inspect="import inspect\n" if "_takes" in make_optimizer else "",
        ddp_args=ddp.torch_args(summary),
        imports=imports,
        constants=constants,
        loader=repr(loader),
        params=repr(params),
        make_optimizer=make_optimizer,
        worker_threads=WORKER_THREADS,
        scheduler_comment=comment,
        # where the study trained (cuda when unrecorded)
        device="cuda" if summary.device in (None, "cuda") else "cpu",
        scheduler=scheduler_code(
            knobs["scheduler"], optimizer="optimizer", total="total_steps", lr="LR", indent=" " * 16
        ),
        dtype="torch." + precision.dtype,
        autocast_enabled=precision.autocast,
        scaler_enabled=precision.grad_scaler,
    )
