"""What a study file asks of its task and this machine, checked before any training: the datasets
are map-style, the parameters and metric are the task's, and every value of the space can run
here (loader workers the cores can serve, batches the training set can fill).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from autotune.errors import SpecError
from autotune.search.space import Choices, Domain, Range, Space
from autotune.spec.study_file import StudySpec
from autotune.train.measure import cpu_count
from autotune.train.tasks import Task

# A training epoch's shuffle is a permutation of its indices (torch.randperm): 8 bytes a sample.
SHUFFLE_BYTES_PER_SAMPLE = 8


def check_datasets(spec: StudySpec, task: Task) -> None:
    """Both sets map-style Datasets whose length is a count: autotune counts them (epochs, the
    largest batch) and samples them by index (seeded shuffles, the validation pass)."""
    for which, data in (("training", task.train), ("validation", task.val)):
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise SpecError(
                spec.path,
                "task",
                spec.task,
                f"the task's {which} set is {type(data).__name__}; autotune "
                f"needs a map-style Dataset (with __len__ and __getitem__), "
                f"such as a TensorDataset",
            )
        try:
            len(data)
        except Exception as exc:  # noqa: BLE001 - a user's __len__ may raise anything
            raise SpecError(
                spec.path,
                "task",
                spec.task,
                f"len() of the task's {which} set ({type(data).__name__}) failed: "
                f"{type(exc).__name__}: {exc}; its __len__ must return the number of samples, "
                f"a whole number >= 0",
            ) from None
    _check_shuffle_fits(spec, len(task.train))


def _check_shuffle_fits(spec: StudySpec, samples: int) -> None:
    """A training set too large for its epoch's shuffle to fit in this machine's memory: refused
    here, not taken for a trial that ran out of memory (which would prune the space unrun)."""
    needed = samples * SHUFFLE_BYTES_PER_SAMPLE
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > memory // 2:
        raise SpecError(
            spec.path,
            "task",
            spec.task,
            f"the task's training set has {samples} samples: each epoch's shuffle is a "
            f"permutation of {needed / 2**30:,.0f} GiB ({SHUFFLE_BYTES_PER_SAMPLE} bytes a "
            f"sample), more than half this machine's {memory / 2**30:.0f} GiB of memory; "
            f"check the dataset's __len__",
        )


def check_task(spec: StudySpec, space: Space, task: Task) -> None:
    """The study's parameters and metric against what the task takes and measures."""
    for name in task.unused(dict(space.params)):
        raise SpecError(
            spec.path,
            f"space.params.{name}",
            name,
            f"neither the task's model factory nor its optimizer takes a parameter named {name}; "
            f"add {name}=... to one of their signatures (or **kwargs)",
        )
    if spec.target.metric != task.metric_name:
        raise SpecError(
            spec.path,
            "target.metric",
            spec.target.metric,
            f"task {spec.task} measures {task.metric_name!r}",
        )
    if len(task.val) == 0:  # every evaluation would fail, inside the training loop
        raise SpecError(
            spec.path,
            "task",
            spec.task,
            "the task's validation set is empty: the target is measured on it; "
            "give it at least one sample",
        )


MAX_WORKERS_PER_CORE = (
    4  # loader workers beyond this only queue for the cores (and each holds memory)
)


def largest(domain: Domain) -> Any:
    return domain.high if isinstance(domain, Range) else max(domain.values)


def smallest(domain: Domain) -> Any:
    return domain.low if isinstance(domain, Range) else min(domain.values)


def check_feasible(
    spec: StudySpec, space: Space, baseline: dict[str, Any], task: Task, notices: list[str]
) -> Space:
    """Values no trial could run with, on this machine or with this task: refused before the first
    trial instead of failing every trial that draws them, or, for loader workers beyond the cores
    and batch sizes the training set cannot fill while smaller ones can, removed with a notice."""
    space = _fit_workers(spec, space, baseline, notices)
    return _fit_batches(spec, space, baseline, len(task.train), notices)


def _fit_workers(
    spec: StudySpec, space: Space, baseline: dict[str, Any], notices: list[str]
) -> Space:
    # The cores this process may use (its affinity, as a scheduler or taskset gives it).
    cores = cpu_count()
    most = MAX_WORKERS_PER_CORE * cores
    available = f"{cores} CPU core{'s are' if cores > 1 else ' is'} available to autotune here"
    counts = space["num_workers"]
    if smallest(counts) <= most < largest(counts):
        # A study written for a bigger machine (16 workers on a GPU node) still runs on this one.
        if isinstance(counts, Choices):
            kept: Domain = Choices(tuple(w for w in counts.values if w <= most))
            removed = ", ".join(str(w) for w in counts.values if w > most)
        else:
            high = int(counts.high)
            kept, removed = (
                dataclasses.replace(counts, high=most),
                str(high) if high == most + 1 else f"{most + 1} to {high}",
            )
        notices.append(
            f"num_workers {removed} removed from the search space: {available} "
            f"(at most {MAX_WORKERS_PER_CORE} loader workers a core)"
        )
        space = space.replace("num_workers", kept)
    for key, workers in (
        ("space.num_workers", smallest(space["num_workers"])),
        ("baseline.num_workers", baseline["num_workers"]),
    ):
        if workers > most:
            raise SpecError(
                spec.path,
                key,
                workers,
                f"{available}: at most {most} loader workers ({MAX_WORKERS_PER_CORE} a core)",
            )
    return space


def _fit_batches(
    spec: StudySpec, space: Space, baseline: dict[str, Any], samples: int, notices: list[str]
) -> Space:
    # Each of a trial's processes trains a micro-batch of batch_size: the effective batch is
    # batch_size x accumulation_steps x devices_per_trial.
    devices = spec.devices_per_trial
    times = " x devices_per_trial" if devices > 1 else ""
    over = f" ({devices} devices a trial)" if devices > 1 else ""
    per_batch = smallest(space["accumulation_steps"]) * devices  # samples a step per batch_size
    for key, batch, accumulation in (
        ("baseline.batch_size", baseline["batch_size"], baseline["accumulation_steps"]),
        ("space.batch_size", smallest(space["batch_size"]), smallest(space["accumulation_steps"])),
    ):
        if batch * accumulation * devices > samples:
            factors = f"{batch} x {accumulation}" + (f" x {devices}" if devices > 1 else "")
            raise SpecError(
                spec.path,
                key,
                batch,
                f"the task has {samples} training samples: batch_size x accumulation_steps"
                f"{times} ({factors}) must not exceed them",
            )
    batches = space["batch_size"]
    if isinstance(batches, Choices) and largest(batches) * per_batch > samples:
        kept = tuple(b for b in batches.values if b * per_batch <= samples)
        removed = ", ".join(str(b) for b in batches.values if b not in kept)
        notices.append(
            f"batch_size {removed} removed from the search space: "
            f"the task has {samples} training samples{over}"
        )
        space = space.replace("batch_size", Choices(kept))
    elif isinstance(batches, Range) and batches.high * per_batch > samples:
        high = samples // per_batch
        notices.append(
            f"batch_size {high + 1} to {batches.high:g} removed from the search space: "
            f"the task has {samples} training samples{over}"
        )
        space = space.replace(
            "batch_size",
            dataclasses.replace(batches, high=high)
            if high > batches.low
            else Choices((int(batches.low),)),
        )
    return space
