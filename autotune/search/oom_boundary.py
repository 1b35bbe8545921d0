"""The out-of-memory boundary: configurations known to run out of memory before they run.

A micro-batch's memory grows with its size and with the bytes per activation of its precision,
and shrinks with the share of the model's blocks that activation checkpointing recomputes instead
of keeping; the training set kept on the device (data_on_device) adds its own bytes; nothing else
among the maths and loader knobs (learning rate, schedule, accumulation, the DataLoader's
settings) changes what the device holds. So once a configuration has run out of memory, any
configuration with the same parameters (a model's width may be one), the same memory format,
compilation and cuDNN search, a micro-batch at least as large, a precision at least as wide, no
larger share checkpointed and its training set on the device wherever the other's was needs at
least as much memory, and would run out too: it is pruned without running. A run out of memory
without checkpointing says nothing of one with it, nor one with the training set on the device
of one without it (the set alone may be what did not fit). Pure functions over plain mappings,
testable without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.search.knob import DDP_NAMES, PRECISIONS, share
from autotune.search.space import FORMAT_KNOBS, KNOBS, filled

# Knobs that change memory in either direction (compiled kernels fuse away activations; layouts and
# cuDNN's algorithms need other workspaces): a bound holds only between equal settings of these.
# TF32 changes the arithmetic's precision, not its tensors, and the fused step the kernels that
# update the parameters, not what they hold: a bound holds across them. Checkpointing is ordered:
# checkpointing fewer blocks keeps more activations. DDP's buckets hold gradients (once more, or as
# their storage with gradient_as_bucket_view): a bound holds only between equal DDP settings.
SAME_LAYOUT = (
    *(k for k in FORMAT_KNOBS if k not in ("tf32", "fused_optimizer", "checkpointing")),
    *DDP_NAMES,
)


def needs_at_least(config: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """True when `config` needs at least the memory `other` needed."""
    same_params = {k: v for k, v in config.items() if k not in KNOBS} == {
        k: v for k, v in other.items() if k not in KNOBS
    }
    mine, theirs = filled(config), filled(other)
    same_layout = all(mine[k] == theirs[k] for k in SAME_LAYOUT)
    return (
        same_params
        and same_layout
        and config["batch_size"] >= other["batch_size"]
        and PRECISIONS[config["precision"]].bytes >= PRECISIONS[other["precision"]].bytes
        and share(mine["checkpointing"]) <= share(theirs["checkpointing"])
        and mine["data_on_device"] >= theirs["data_on_device"]
    )


def bound_by(
    config: Mapping[str, Any], ran_out: Iterable[tuple[int, Mapping[str, Any]]]
) -> int | None:
    """The number of a trial that ran out of memory with no more than `config` needs, or None.

    `ran_out` holds (trial number, configuration) of the trials that really ran out of memory.
    """
    for number, other in ran_out:
        if needs_at_least(config, other):
            return number
    return None


def contradicted(
    ran_out: Mapping[int, Mapping[str, Any]], trained: Mapping[int, Mapping[str, Any]]
) -> set[int]:
    """The trials of `ran_out` (number -> configuration) that a later trial of `trained` (the
    same), needing at least their memory, trained through without running out: the memory was
    another process's for a while, or an error was misread, so no configuration is pruned on
    their word any more."""
    return {
        number
        for number, other in ran_out.items()
        if any(
            later > number and needs_at_least(config, other) for later, config in trained.items()
        )
    }


def not_run_reason(config: Mapping[str, Any], number: int, other: Mapping[str, Any]) -> str:
    return (
        f"not run: batch_size {config['batch_size']} in {config['precision']}{_kept(config)} "
        f"needs at least the memory of trial {number} "
        f"(batch_size {other['batch_size']} in {other['precision']}{_kept(other)}), "
        "which ran out of memory"
    )


def _kept(config: Mapping[str, Any]) -> str:
    """What else the reason names: checkpointing and the training set on the device, where on."""
    knobs = filled(config)
    value, kept = knobs["checkpointing"], ""
    if value:
        kept = (
            " checkpointing all blocks" if value is True else f" checkpointing {value:g} of blocks"
        )
    return kept + (" with the training set on the device" if knobs["data_on_device"] else "")
