"""Activation checkpointing: a block keeps only its inputs in the forward pass and runs its forward
again in the backward pass (torch.utils.checkpoint, non-reentrant). Less memory, more compute, the
same step.

A model opts in with one method, `checkpoint_blocks(self) -> Sequence[nn.Module]`: its repeated
blocks in forward order. The checkpointing knob checkpoints the first ceil(share x n) of them (true:
all): the early blocks, which usually hold the largest activations.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autotune.search.knob import share

HOOK = "checkpoint_blocks"


def blocks(model: nn.Module) -> list[nn.Module] | None:
    """The model's checkpoint_blocks(), or None where it defines none."""
    method = getattr(model, HOOK, None)
    return None if not callable(method) else list(method())


def problem(model: nn.Module) -> str | None:
    """Why `model` cannot be checkpointed, or None."""
    try:
        found = blocks(model)
    except Exception as error:  # noqa: BLE001 - whatever the hook raises is the reason
        return f"the task's model's {HOOK}() raised {type(error).__name__}: {error}"[:300]
    if found is None:
        return f"the task's model defines no {HOOK}() method naming its blocks"
    if not found or not all(isinstance(block, nn.Module) for block in found):
        return f"the task's model's {HOOK}() returned no sequence of nn.Module blocks"
    return None


def count(value: bool | float, n: int) -> int:
    """How many of `n` blocks the knob's `value` checkpoints: at least one for any share above 0
    (rounded first, so 0.3 of 10 is 3, not float error's 4)."""
    return math.ceil(round(share(value) * n, 6))


def apply(model: nn.Module, value: bool | float) -> nn.Module:
    """`model` with the first blocks that `value` names checkpointed (in place; returned for
    chaining). Applying it twice checkpoints no block twice."""
    if not share(value):
        return model
    reason = problem(model)
    if reason is not None:  # fit_to_device fixes the knob off for such a model before a study
        raise ValueError(reason)
    found = blocks(model) or []
    for block in found[: count(value, len(found))]:
        if not isinstance(vars(block).get("forward"), Checkpointed):
            block.forward = Checkpointed(block)  # an instance attribute: nn.Module calls it
    return model


def checkpointed(model: nn.Module) -> list[nn.Module]:
    """The blocks of `model` whose forward is checkpointed."""
    return [m for m in model.modules() if isinstance(vars(m).get("forward"), Checkpointed)]


class Checkpointed:
    """A block's forward through torch.utils.checkpoint. It calls the block's class forward, so a
    deep copy of the model checkpoints its own blocks, not the original's."""

    def __init__(self, block: nn.Module) -> None:
        self.block = block

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        forward = functools.partial(type(self.block).forward, self.block)
        if not torch.is_grad_enabled():  # evaluation: nothing is kept for a backward pass
            return forward(*args, **kwargs)
        if torch.compiler.is_compiling():
            # The compiled graph updates BatchNorm's statistics once, whatever it recomputes; a
            # context_fn would be taken for a selective-checkpointing policy.
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(
            forward,
            *args,
            use_reentrant=False,
            context_fn=functools.partial(_contexts, self.block),
            **kwargs,
        )


def _contexts(block: nn.Module) -> tuple[Any, Any]:
    return contextlib.nullcontext(), _statistics_kept(block)


@contextlib.contextmanager
def _statistics_kept(block: nn.Module) -> Iterator[None]:
    """The recomputation leaves BatchNorm's running statistics as the forward pass left them:
    running the forward again would update them twice (the evaluation's maths would change)."""
    kept = [
        (buffer, buffer.clone())
        for module in block.modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for buffer in module.buffers()
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in kept:
                buffer.copy_(value)
