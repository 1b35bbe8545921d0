"""The text of `--format torch`'s module (export/pytorch.py fills it in): the settings, the
loader, model, optimizer, schedule and precision built as a trial built them, and its step."""

from __future__ import annotations

from string import Template

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
make_optimizer=make_optimizer, gather=None):
    """`model` moved to `device`, and the loader, optimizer, scheduler, \
autocast and scaler that train it.

    `training.model` is the module train_step calls: torch.compile(module) when COMPILE (its first
    steps compile, on your clock as on the trial's). `training.module` is the uncompiled module with
    the same parameters: evaluate and save that one, as autotune evaluated it (eval mode would make
    a compiled module compile a second graph, and a compiled state_dict's keys \
start with _orig_mod.).
    It sets torch.backends.cudnn.benchmark and the float32 matmul precision (TF32 or not) for the
    whole process (the trial set them for its run). With DATA_ON_DEVICE there is no DataLoader:
    `gather(indices, keys)` returns those samples' batch on the device from a copy of the training
    set kept there (your task's device_train(device); keys, one random int64 a sample, for its
    augmentation); without one, a TensorDataset's tensors are copied there.
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
    batching = EpochBatches(sampler, LOADER["batch_size"], LOADER["drop_last"])
    if DATA_ON_DEVICE:  # each batch gathered on the device, where the training set is kept
        if gather is None:
            if not isinstance(train_dataset, torch.utils.data.TensorDataset):
                raise TypeError(\
"DATA_ON_DEVICE: pass make_training(gather=) your task's device_train(device), or a TensorDataset")
            gather = functools.partial(_indexed, [t.to(device) for t in train_dataset.tensors])
        loader = _Gathered(batching, gather)
    else:
        loader = DataLoader(train_dataset, batch_sampler=batching,
                            **{k: v for k, v in LOADER.items() if k not in _BATCHING},
                            pin_memory=PIN_MEMORY and device.type == "cuda",  # CUDA copies only
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


class _Gathered:
    """DATA_ON_DEVICE's loader: each micro-batch of `batches` (sample indices) gathered at once."""

    def __init__(self, batches, gather):
        self.batches, self.gather = batches, gather

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:  # the keys from torch's random numbers, as a worker's draws are
            yield self.gather(torch.tensor(batch), torch.randint(0, 2**62, (len(batch),)))


def _indexed(tensors, indices, keys):
    indices = indices.to(tensors[0].device)  # once, for every tensor
    return [t[indices] for t in tensors]


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
