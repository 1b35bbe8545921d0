"""Small tasks for tests: train in well under a second on CPU, and fail on purpose where asked."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune import Task

OOM_BATCH = 128  # forward passes on at least this many samples run out of memory


def _blobs(n: int, seed: int) -> TensorDataset:
    """Four Gaussian blobs in 8 dimensions: easy to learn, not instant."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = torch.eye(4, 8) * 3
    return TensorDataset(centres[labels] + torch.randn(n, 8, generator=g), labels)


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def blobs() -> Task:
    return Task(model=_mlp, train=_blobs(1024, 0), val=_blobs(512, 1))


def _tunable_mlp(width: int = 32, dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Dropout(dropout), nn.Linear(width, 4))


def _tunable_optimizer(
    parameters, lr: float, *, weight_decay: float = 0.0, kind: str = "sgd"
) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(parameters, lr=lr, momentum=0.9, weight_decay=weight_decay)


def tunable() -> Task:
    """The blobs task with a model and an optimizer that take study parameters: width, dropout,
    weight_decay and kind (sgd or adamw)."""
    return Task(
        model=_tunable_mlp, optimizer=_tunable_optimizer, train=_blobs(1024, 0), val=_blobs(512, 1)
    )


def _blind_on_trial_zero() -> nn.Module:
    """The blobs MLP, blind to its input (its first layer's weights zero and frozen, so it cannot
    pass chance) when built under trial 0's seeds: those of a study with seed 0 are multiples of
    100,000, its replicates' too. A maths that misses the target on one trial's seeds only."""
    model = _mlp()
    if torch.initial_seed() % 100_000 == 0:
        model[0].weight.data.zero_()
        model[0].weight.requires_grad_(False)
    return model


def misses_on_trial_zero() -> Task:
    return Task(model=_blind_on_trial_zero, train=_blobs(1024, 0), val=_blobs(512, 1))


OOM_RAISED: list[int] = []  # the batch size of every out-of-memory error raised in this process


class CudaOOMAtLargeBatch(nn.Module):
    """Raises torch.cuda.OutOfMemoryError, as the CUDA allocator does, for large batches."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) >= OOM_BATCH:
            OOM_RAISED.append(len(x))
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {len(x)} GiB")
        return self.net(x)


class AllocatorOOMAtLargeBatch(CudaOOMAtLargeBatch):
    """Really exhausts the allocator of the device it runs on (CPU or CUDA) for large batches:
    asks for an impossible buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) >= OOM_BATCH:
            torch.empty(2**62, dtype=torch.uint8, device=x.device)
        return self.net(x)


def cuda_oom() -> Task:
    return Task(model=CudaOOMAtLargeBatch, train=_blobs(1024, 0), val=_blobs(512, 1))


def allocator_oom() -> Task:
    return Task(model=AllocatorOOMAtLargeBatch, train=_blobs(1024, 0), val=_blobs(512, 1))


def _no_room_for_the_training_set(device: torch.device) -> Any:
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 150.00 GiB")


def too_large_for_the_device() -> Task:
    """blobs, whose training set runs out of memory as it is copied to the device: a set that
    does not fit, with the DataLoader's batches fitting well."""
    return dataclasses.replace(blobs(), device_train=_no_room_for_the_training_set)


# Bytes of activations a training forward pass of ActivationBudgetNet may keep for its backward
# pass: a batch of 64 fits, one of 128 only with its blocks checkpointed (see test_checkpointing).
ACTIVATION_BUDGET = 384 * 1024


class SavedBytes:
    """Counts the bytes of the tensors autograd keeps for the backward pass while it is active
    (each storage once, the model's parameters not at all); past `limit`, raises
    torch.cuda.OutOfMemoryError, as a device that holds no more would."""

    def __init__(self, model: nn.Module, *, limit: float = float("inf")) -> None:
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.limit, self.seen, self.bytes = limit, set(), 0

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters | self.seen:
            self.seen.add(storage.data_ptr())
            self.bytes += storage.nbytes()
            if self.bytes > self.limit:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory: the activations need more than {self.limit} bytes"
                )
        return tensor

    def __enter__(self) -> SavedBytes:
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.__exit__(*exc)


class ActivationBudgetNet(nn.Module):
    """An MLP of residual blocks (each widening 4x inside) that runs out of memory when a training
    forward pass keeps more than ACTIVATION_BUDGET bytes for its backward pass; its blocks can be
    checkpointed."""

    def __init__(self, width: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Linear(8, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return self._forward(x)
        with SavedBytes(self, limit=ACTIVATION_BUDGET):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

    def checkpoint_blocks(self) -> list[nn.Module]:
        return list(self.blocks)


def activation_budget() -> Task:
    return Task(model=ActivationBudgetNet, train=_blobs(1024, 0), val=_blobs(512, 1))


def broken_model() -> Task:
    def model() -> nn.Module:
        raise ValueError("this model cannot be built")

    return Task(model=model, train=_blobs(256, 0), val=_blobs(128, 1))


class Misbehaves(nn.Module):
    """Trains like the blobs MLP until its first large batch, then does what `how` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.net, self.how = _mlp(), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) >= OOM_BATCH:
            if self.how == "hang":
                time.sleep(3600)
            elif self.how == "exit":
                os._exit(3)
            elif self.how == "sys.exit":
                sys.exit(3)
            elif self.how == "segfault":
                ctypes.string_at(0)  # reads address 0: SIGSEGV
        return self.net(x)


def hangs() -> Task:
    return Task(model=lambda: Misbehaves("hang"), train=_blobs(1024, 0), val=_blobs(512, 1))


def exits() -> Task:
    return Task(model=lambda: Misbehaves("exit"), train=_blobs(1024, 0), val=_blobs(512, 1))


def _starts_a_process() -> nn.Module:
    """Builds the blobs MLP and starts a process it never waits for, as a careless model might."""
    import subprocess

    subprocess.Popen(["sleep", "300"])
    return _mlp()


def leaves_a_process() -> Task:
    return Task(model=_starts_a_process, train=_blobs(1024, 0), val=_blobs(512, 1))


def _sets_float64() -> nn.Module:
    """Builds the blobs MLP, then sets float64 as torch's default dtype, as a careless model file
    might at import: this trial trains, a later one in the same process would build in float64."""
    model = _mlp()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    return model


def sets_float64() -> Task:
    return Task(model=_sets_float64, train=_blobs(1024, 0), val=_blobs(512, 1))


def _starts_a_thread() -> nn.Module:
    """Builds the blobs MLP and starts a thread that never ends (a prefetcher nobody stops)."""
    import threading

    threading.Thread(target=lambda: time.sleep(600), daemon=True).start()
    return _mlp()


def leaves_a_thread() -> Task:
    return Task(model=_starts_a_thread, train=_blobs(1024, 0), val=_blobs(512, 1))


def _opens_files() -> nn.Module:
    """Builds the blobs MLP and opens 40 descriptors it never closes."""
    for _ in range(40):
        os.open(os.devnull, os.O_RDONLY)
    return _mlp()


def leaves_descriptors() -> Task:
    return Task(model=_opens_files, train=_blobs(1024, 0), val=_blobs(512, 1))


def no_validation_samples() -> Task:
    return Task(model=_mlp, train=_blobs(1024, 0), val=_blobs(0, 1))


def calls_sys_exit() -> Task:
    """sys.exit(3) from the model's forward pass at a large batch."""
    return Task(model=lambda: Misbehaves("sys.exit"), train=_blobs(1024, 0), val=_blobs(512, 1))


def segfaults() -> Task:
    return Task(model=lambda: Misbehaves("segfault"), train=_blobs(1024, 0), val=_blobs(512, 1))


def nan_metric() -> Task:
    """Trains like blobs; its metric is NaN, as a metric over non-finite outputs is."""
    return Task(
        model=_mlp,
        train=_blobs(1024, 0),
        val=_blobs(512, 1),
        metric=lambda outputs, targets: float("nan"),
    )


class _Unreadable(TensorDataset):
    """Fails to read sample 100, as a dataset with a bad file does."""

    def __getitem__(self, index: int):
        if index == 100:
            raise IndexError(f"sample {index} is unreadable")
        return super().__getitem__(index)


def bad_sample() -> Task:
    data = _blobs(1024, 0)
    return Task(model=_mlp, train=_Unreadable(*data.tensors), val=_blobs(512, 1))


WORKER_PIDS = (
    "autotune-test-loader-worker-*"  # in the temporary folder: one file per worker that loaded
)


class _Noting(TensorDataset):
    """Notes the pid of each process that loads from it (a DataLoader worker: the trial's child),
    in a file that holds the pid of its parent as the OS sees it and as multiprocessing does (the
    process that started it: these differ where a fork server started it)."""

    def __getitem__(self, index: int):
        import multiprocessing
        import tempfile
        from pathlib import Path

        note = Path(tempfile.gettempdir()) / WORKER_PIDS.replace("*", str(os.getpid()))
        if not note.exists():
            starter = multiprocessing.parent_process()
            note.write_text(f"{os.getppid()} {starter.pid if starter else ''}")
        return super().__getitem__(index)


def notes_workers() -> Task:
    """Trains as blobs does, its DataLoader workers noting who started them."""
    return Task(model=_mlp, train=_Noting(*_blobs(1024, 0).tensors), val=_blobs(512, 1))


def hangs_with_workers() -> Task:
    """Hangs in its first large batch while its DataLoader workers are alive and loading."""
    return Task(
        model=lambda: Misbehaves("hang"),
        train=_Noting(*_blobs(1024, 0).tensors),
        val=_blobs(512, 1),
    )


def lrs_of(optimizer: torch.optim.Optimizer, scheduler: Any, steps: int) -> list[float]:
    """The lr of each of `steps` optimizer steps, the schedule stepped after each."""
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def paced_quick() -> Task:
    """The paced task at a quarter of its default costs, in the same proportions."""
    from autotune.train.tasks import paced

    return paced.make(
        load_seconds=paced.LOAD_SECONDS / 4, compute_seconds=paced.COMPUTE_SECONDS / 4
    )


def paced_on_device() -> Task:
    """paced_quick that keeps its training set on the device too, gathered there at no cost: far
    faster than any step."""
    from autotune.train.tasks import paced

    return paced.make(
        load_seconds=paced.LOAD_SECONDS / 4,
        compute_seconds=paced.COMPUTE_SECONDS / 4,
        device_load_seconds=0.0,
    )


def paced_narrow_start() -> Task:
    """paced_quick whose first 16-bit step waits 1 s: bf16 trains twice as fast, after a later
    start that only a run of over about 16,000 samples wins back."""
    from autotune.train.tasks import paced

    return paced.make(
        load_seconds=paced.LOAD_SECONDS / 4,
        compute_seconds=paced.COMPUTE_SECONDS / 4,
        narrow_start_seconds=1.0,
    )


def paced_worker_start() -> Task:
    """paced_quick whose loader workers each wait 3 s before their first batch: four workers feed
    bf16 16,000 samples/s, against 3,800 with none, but only a run of over about 15,000 samples
    wins their start back."""
    from autotune.train.tasks import paced

    return paced.make(
        load_seconds=paced.LOAD_SECONDS / 4,
        compute_seconds=paced.COMPUTE_SECONDS / 4,
        worker_start_seconds=3.0,
    )


def paced_per_step() -> Task:
    """The paced task with a cost a step as well as a sample: a larger micro-batch computes faster
    a sample (at fp32 32/(32 x 0.1 ms + 6 ms) = 3,500 a second, 128 samples 6,800)."""
    from autotune.train.tasks import paced

    return paced.make(load_seconds=0.2e-3, compute_seconds=0.1e-3, step_seconds=6e-3)


class _ExitsAtSmallBatches(nn.Module):
    """The blobs MLP, whose process exits without a word at a training batch under 64: a crash
    that only a measurement at a smaller batch meets."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and len(x) < 64:
            os._exit(3)
        return self.net(x)


def exits_at_small_batches() -> Task:
    return Task(model=_ExitsAtSmallBatches, train=_blobs(4096, 0), val=_blobs(512, 1))


def paced_input_bound() -> Task:
    """The paced task with loading so slow that four workers still hold the step back."""
    from autotune.train.tasks import paced

    return paced.make(load_seconds=0.3e-3, compute_seconds=0.0375e-3)


class _FailsOnRankOne(nn.Module):
    """The blobs MLP, which on rank 1 of a run on several devices (only there) does what `how`
    says at its first training forward pass: runs out of memory, hangs (its peers then wait for
    it in their gradients' all-reduce), or exits without a word."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.net, self.how = _mlp(), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if self.training and distributed and torch.distributed.get_rank() == 1:
            if self.how == "oom":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
            if self.how == "hang":
                time.sleep(3600)
            if self.how == "exit":
                os._exit(3)
        return self.net(x)


def oom_on_rank_one() -> Task:
    return Task(model=lambda: _FailsOnRankOne("oom"), train=_blobs(1024, 0), val=_blobs(512, 1))


def hangs_on_rank_one() -> Task:
    return Task(model=lambda: _FailsOnRankOne("hang"), train=_blobs(1024, 0), val=_blobs(512, 1))


def exits_on_rank_one() -> Task:
    return Task(model=lambda: _FailsOnRankOne("exit"), train=_blobs(1024, 0), val=_blobs(512, 1))


def _slowed_blobs(step_seconds: float) -> Task:
    """The blobs task, each training forward pass `step_seconds` long."""

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.training:
                time.sleep(step_seconds)
            return self.net(x)

    return Task(model=Slow, train=_blobs(1024, 0), val=_blobs(512, 1))


def slow_blobs() -> Task:
    """Each training step 0.2 s long: a trial lasts seconds."""
    return _slowed_blobs(0.2)


def brisk_blobs() -> Task:
    """Each training step 30 ms long: a trial lasts about a second, long enough for every one of
    a few workers to have started before the budget is taken."""
    return _slowed_blobs(0.03)


def steady_blobs() -> Task:
    """Each training step 5 ms long: a trial spends nearly all its time training, and a study
    of a dozen trials still takes seconds."""
    return _slowed_blobs(0.005)


def paced_narrow_step() -> Task:
    """A paced task whose 16-bit step costs a quarter a sample but 8 ms more a step (its casts):
    at 128 samples bf16 steps in 16 ms against fp32's 32, at 8 samples in 8.5 ms against 2.
    Loading costs nothing, so the loader settles nothing."""
    from autotune.train.tasks import paced

    return paced.make(
        load_seconds=0.0,
        compute_seconds=0.25e-3,
        narrow_factor=0.25,
        narrow_step_seconds=8e-3,
    )
