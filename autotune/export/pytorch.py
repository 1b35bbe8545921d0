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
from string import Template

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
from autotune.record.derived import current_reference
from autotune.record.summary import Summary
from autotune.search.knob import PRECISIONS
from autotune.search.recipe import SCHEDULES, SGD_ARGS, WORKER_THREADS, loader_kwargs
from autotune.search.space import KNOBS

# The module's lines are its own, some over 100 columns: a backslash ending a line here continues
# that line on the next (Python's escaped newline), so each stays whole in what is written.
MODULE = Template('''\
"""$provenance.

The winning training settings in plain PyTorch, built as autotune's trial built them:

    training = make_training(model, train_dataset, device=torch.device("$device"))
    for _ in range(training.total_steps):
        train_step(training, loss_fn=torch.nn.functional.cross_entropy)

Evaluate `training.module` (never compiled), \
its inputs moved by `to_device(inputs, training.device)`.
$distributed_usage
Under torch.distributed's launcher (a process group initialised before make_training), each
process trains its shard of every epoch (DistributedSampler) with the model in
DistributedDataParallel, all-reducing once an optimizer step, as autotune's trials on several
devices did; batch_size is then per process.
"""

from __future__ import annotations

import contextlib
import functools
${inspect}import itertools
import math
import os
import types

import torch
from torch.utils.data import DataLoader
$imports
$constants
# The DataLoader's arguments besides the dataset and pin_memory, as the trial gave them: \
shuffled, whole
# micro-batches only (accumulation stays exact, BatchNorm never sees a batch of one), \
workers kept across epochs.
LOADER = $loader
_BATCHING = ("batch_size", "shuffle", "drop_last")  # EpochBatches' part of LOADER

# Your own parameters as the study chose them. autotune passed each by keyword to whichever of the
# task's model factory and optimizer names it: build `model` with those your model factory takes.
PARAMS = $params


$make_optimizer


def _worker_init(_worker_id):
    torch.set_num_threads($worker_threads)  # each loader worker is one process on one core


def make_training(model, train_dataset, *, device, max_epochs=MAX_EPOCHS, seed=None, \
make_optimizer=make_optimizer):
    """`model` moved to `device`, and the loader, optimizer, scheduler, \
autocast and scaler that train it.

    `training.model` is the module train_step calls: torch.compile(module) when COMPILE (its first
    steps compile, on your clock as on the trial's). `training.module` is the uncompiled module with
    the same parameters: evaluate and save that one, as autotune evaluated it (eval mode would make
    a compiled module compile a second graph, and a compiled state_dict's keys \
start with _orig_mod.).
    It sets torch.backends.cudnn.benchmark and the float32 matmul precision (TF32 or not) for the
    whole process (the trial set them for its run).
    """
    if max_epochs is None:
        raise ValueError(\
"the study did not record max_epochs, the length of the LR schedule: pass max_epochs=")
    device = torch.device(device)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores - NUM_WORKERS))  # the cores the loader workers leave free
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    if distributed:  # under torchrun: each process its shard of every epoch, shuffled
        sampler = torch.utils.data.DistributedSampler(train_dataset, shuffle=LOADER["shuffle"], \
seed=seed or 0)
    elif LOADER["shuffle"]:
        sampler = torch.utils.data.RandomSampler(train_dataset, generator=generator)
    else:
        sampler = torch.utils.data.SequentialSampler(train_dataset)
    loader = DataLoader(train_dataset, batch_sampler=EpochBatches(sampler, LOADER["batch_size"], \
LOADER["drop_last"]),
                        **{k: v for k, v in LOADER.items() if k not in _BATCHING},
                        pin_memory=PIN_MEMORY and device.type == "cuda",  # helps CUDA copies only
                        worker_init_fn=_worker_init if NUM_WORKERS > 0 else None,
                        generator=generator)
    model = model.to(device)
    if CHECKPOINTING:  # the first blocks of model.checkpoint_blocks(), as the trial did
        from autotune.train.checkpointing import apply

        apply(model, CHECKPOINTING)
    if CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)  \
# its 4-D weights; to_device lays out 4-D inputs
    model.train()
    module = model
    if distributed:  # before compile, as the trial wrapped it
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            $ddp_args)
    torch.backends.cudnn.benchmark = CUDNN_BENCHMARK  # set either way, as the trial set it
    torch.set_float32_matmul_precision("high" if TF32 else "highest")  # "high": TF32 tensor cores
    optimizer = make_optimizer(model.parameters(), LR, \
**({"fused": True} if FUSED_OPTIMIZER else {}))
    # The schedule runs over every optimizer step of max_epochs, stepped once per optimizer step.
    total_steps = max(1, math.floor(max_epochs * len(loader) / ACCUMULATION_STEPS))
$scheduler_comment    scheduler = $scheduler
    autocast = functools.partial(torch.autocast, device.type, dtype=$dtype, \
enabled=$autocast_enabled)
    scaler = torch.amp.GradScaler(device.type, enabled=$scaler_enabled)  \
# fp16: keeps small gradients from underflowing
    # Micro-batches epoch after epoch, so an effective batch may span an epoch boundary.
    batches = _batches(loader)
    return types.SimpleNamespace(model=torch.compile(model) if COMPILE else model, module=module, \
device=device,
                                 loader=loader, batches=batches, optimizer=optimizer, \
scheduler=scheduler,
                                 total_steps=total_steps, autocast=autocast, scaler=scaler)


class EpochBatches(torch.utils.data.Sampler):
    """The batches of `sampler`'s epochs one after another, without end: one loader iterator then
    serves the whole run, and its workers load the next epoch's first batches while this epoch's
    last ones train (a new iterator each epoch would ask for them only after). Each epoch is
    shuffled afresh, a DistributedSampler told its number. len(): one epoch's batches."""

    def __init__(self, sampler, batch_size, drop_last):
        self.batches = torch.utils.data.BatchSampler(sampler, batch_size, drop_last)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for epoch in itertools.count():
            if hasattr(self.batches.sampler, "set_epoch"):
                self.batches.sampler.set_epoch(epoch)
            yield from self.batches


def _batches(loader):
    """The loader's batches, epoch after epoch; its workers start at the first one asked for."""
    yield from loader


def to_device(inputs, device, *, non_blocking=False):
    """A batch's inputs on `device`, channels-last when CHANNELS_LAST and the batch is 4-D \
(N, C, H, W)."""
    if CHANNELS_LAST and inputs.dim() == 4:
        return inputs.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
    return inputs.to(device, non_blocking=non_blocking)


def train_step(training, *, loss_fn):
    """One optimizer step over the next ACCUMULATION_STEPS micro-batches, then one scheduler step.

    Each micro-batch's loss is divided by their number, so with a mean-reduced loss the gradient
    equals that of one batch holding all of them.
    """
    micro_batches = list(itertools.islice(training.batches, ACCUMULATION_STEPS))
    for index, (inputs, targets) in enumerate(micro_batches):
        inputs = to_device(inputs, training.device, non_blocking=PIN_MEMORY)
        targets = targets.to(training.device, non_blocking=PIN_MEMORY)
        # under DistributedDataParallel, gradients are all-reduced at the last micro-batch only
        last = index == len(micro_batches) - 1
        synced = contextlib.nullcontext() if last or not hasattr(training.model, "no_sync") \
else training.model.no_sync()
        with synced, training.autocast():
            loss = loss_fn(training.model(inputs), targets) / len(micro_batches)
        training.scaler.scale(loss).backward()
    training.scaler.step(training.optimizer)
    training.scaler.update()
    training.optimizer.zero_grad(set_to_none=True)
    training.scheduler.step()
''')

SGD = Template('''\
def make_optimizer(parameters, lr, **fused):
    """The task's optimizer, $reference: SGD with Nesterov momentum; \
`fused`: fused=True or nothing."""
    return torch.optim.SGD(parameters, lr=lr$sgd_args, **fused)''')

FACTORY = Template('''\
def make_optimizer(parameters, lr, **fused):
    """The task's optimizer, $reference, given the PARAMS it names (and fused=True where
    FUSED_OPTIMIZER), as autotune called it."""
    return $factory(parameters, lr, **_takes($factory, PARAMS, after=2), **fused)


def _takes(function, params, *, after=0):
    """The params `function` accepts by keyword past its first `after` arguments \
(autotune.train.tasks.takes)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return {}
    accepted = list(signature.parameters.values())[after:]
    if any(p.kind is p.VAR_KEYWORD for p in accepted):
        return dict(params)
    names = {p.name for p in accepted if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in params.items() if k in names}''')

UNKNOWN = '''\
def make_optimizer(parameters, lr, **fused):
    """The study did not record its task's optimizer (a command task builds its own; \
a lambda has no importable name)."""
    raise NotImplementedError(\
"pass make_training(..., make_optimizer=) the optimizer your task used: "
                              "(parameters, lr, **fused) -> torch.optim.Optimizer, \
given the PARAMS it names "
                              "(fused: fused=True where FUSED_OPTIMIZER, else nothing)")'''


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
