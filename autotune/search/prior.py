"""A new study's first trials from the prior ML engineers start from (`first_trial: prior`).

Uniformly drawn first trials mostly pair a batch, an lr and a schedule that miss the target, and
each miss costs a whole training run. Engineers instead start from three rules:

- the largest micro-batch that still leaves `batches.MIN_STEPS` optimizer steps an epoch, at the
  fewest accumulation steps (the rule the systems probe measures at, `batches.largest_batch`: the
  baseline's batch where none does): a busier accelerator, with steps enough for the schedule to
  work with;
- the baseline's lr scaled with the effective batch (the linear scaling rule, Goyal et al. 2017,
  "Accurate, Large Minibatch SGD"), spread by `LR_FACTORS` since the rule is only a first guess;
- a schedule that ends: `onecycle` (its warm-up carries the larger lr, as Goyal et al.'s warm-up
  does), else `cosine`; annealing to a small lr reaches a given accuracy in fewer epochs.

A trial names only the knobs the rule decides and the space leaves open: the sampler chooses the
rest (systems knobs, precision, schedule_epochs, the user's parameters), and a fixed knob keeps
its value. Every value named lies in its domain, clamped there when the rule lands outside.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from autotune.search import batches
from autotune.search.space import Choices, Domain, Range, Space, is_integer

# The linear-scaling estimate first, then a third of it, then three times it: half a decade each
# way covers the factor by which the rule is commonly off (below it when the batch grows far past
# the baseline's, where the best lr grows more slowly than the batch; above it when the baseline's
# lr was a cautious hand-picked default), and keeps the trials apart on TPE's log-scaled lr.
LR_FACTORS = (1.0, 1 / 3, 3.0)
# in order of preference: schedules that anneal to the end of the run
SCHEDULERS = ("onecycle", "cosine")


def first_trials(
    space: Space, baseline: Mapping[str, Any], *, train_samples: int | None, count: int
) -> list[dict[str, Any]]:
    """Up to `count` partial trials (knob -> value, what the sampler would otherwise choose) from
    the prior, on `space` for a training set of `train_samples` (None: unknown, so the baseline's
    micro-batch); duplicates left out, as are knobs the space fixes."""
    accumulation = _smallest("accumulation_steps", space["accumulation_steps"])
    # An epoch has train_samples / accumulation / batch optimizer steps: largest_batch's rule with
    # fewer samples.
    samples = None if train_samples is None else train_samples // accumulation
    batch = _nearest(
        "batch_size", space["batch_size"], batches.largest_batch(space, baseline, samples=samples)
    )
    lr = (
        baseline["lr"]
        * batch
        * accumulation
        / (baseline["batch_size"] * baseline["accumulation_steps"])
    )
    scheduler = next((s for s in SCHEDULERS if s in space["scheduler"].values), None)
    common = {
        "batch_size": batch,
        "accumulation_steps": accumulation,
        **({"scheduler": scheduler} if scheduler is not None else {}),
    }
    fixed = space.fixed()
    trials: list[dict[str, Any]] = []
    for factor in LR_FACTORS[:count]:
        trial = {
            name: value
            for name, value in {**common, "lr": _nearest("lr", space["lr"], lr * factor)}.items()
            if name not in fixed
        }
        if trial and trial not in trials:
            trials.append(trial)
    return trials


def _smallest(name: str, domain: Domain) -> Any:
    """The domain's smallest value (a whole-number range's lowest whole number)."""
    if isinstance(domain, Choices):
        return min(domain.values)
    return math.ceil(domain.low) if is_integer(name, domain) else domain.low


def _nearest(name: str, domain: Domain, value: float) -> Any:
    """The value of `domain` nearest `value`: clamped into a range (rounded to a whole number as
    `space.suggest` samples one), or the closest choice by ratio (batches and lrs are compared on
    a log scale), the smaller on a tie."""
    if isinstance(domain, Choices):
        return min(domain.values, key=lambda choice: (abs(math.log(choice / value)), choice))
    assert isinstance(domain, Range)
    if is_integer(name, domain):
        return min(max(round(value), math.ceil(domain.low)), math.floor(domain.high))
    return float(min(max(value, domain.low), domain.high))
