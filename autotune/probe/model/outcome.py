"""The systems probe's rules that outlive one probe: what it chooses among, whether a space is
worth probing, and how its stored outcome narrows the space and reads in the report.

Settings that change speed but not the maths (DataLoader workers, prefetching, pinning, the
training set on the device, memory formats) are settled before the search by the joint probe
(probe/run.py), at the largest micro-batch of the space that still gives `MIN_STEPS` steps an
epoch (search/batches.py): the busier the accelerator, the more it asks of the loader and the
more a narrower precision saves. At a baseline's 32 samples a GPU waits on kernel launches, not
on data or arithmetic. A study stored by an earlier engine (one knob at a time, by short runs)
still narrows its space and reads in the report as it did.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

from autotune.probe.model import text
from autotune.record.summary import BUSY_CORES
from autotune.search.space import NO_LOADER, Choices, Space, every_value, loader_of

FASTER_BY = 0.05  # less than this is noise: a narrower precision or a busier loader must beat it
MAX_LOADER_SETTINGS = 24  # more than this and the loader knobs are left to the search


def loader_settings(space: Space) -> list[dict[str, Any]]:
    """Every distinct loader setting the space allows (prefetch_factor only with workers), then
    the training set on the device (no DataLoader) where the space allows it."""
    settings = []
    if False in space["data_on_device"].values:
        for workers, pin in itertools.product(
            every_value(space["num_workers"]), every_value(space["pin_memory"])
        ):
            prefetches = every_value(space["prefetch_factor"]) if workers > 0 else [None]
            settings += [
                {
                    "data_on_device": False,
                    "num_workers": workers,
                    "prefetch_factor": p,
                    "pin_memory": pin,
                }
                for p in prefetches
            ]
    if True in space["data_on_device"].values:
        settings.append({"data_on_device": True, **NO_LOADER})
    return settings


def worth_probing(space: Space) -> bool:
    """True when the space leaves a choice among loader settings or precisions to settle."""
    loaders = loader_settings(space)
    return (1 < len(loaders) <= MAX_LOADER_SETTINGS) or len(space["precision"].values) > 1


def restrict(space: Space, outcome: Mapping[str, Any]) -> Space:
    """The space with the loader knobs fixed and the precisions the probe kept."""
    if outcome["probed_loader"]:
        loader = outcome["loader"]
        # a study stored before data_on_device was a knob: its loader had a DataLoader
        on_device = loader_of(loader)["data_on_device"]
        space = space.replace("data_on_device", Choices((on_device,)))
        space = space.replace("num_workers", Choices((loader["num_workers"],)))
        space = space.replace("pin_memory", Choices((loader["pin_memory"],)))
        if loader["prefetch_factor"] is not None:
            space = space.replace("prefetch_factor", Choices((loader["prefetch_factor"],)))
    for knob, value in outcome.get("fixed", {}).items():  # the joint probe's formats
        space = space.replace(knob, Choices((value,)))
    return space.replace(
        "precision",
        Choices(tuple(p for p in space["precision"].values if p in outcome["precisions"])),
    )


def describe(outcome: Mapping[str, Any]) -> str:
    """One line for the report: what the probe settled, and what it cost."""
    if outcome.get("kind") == "joint":
        return text.describe(outcome) + load_note(outcome, chose=bool(outcome.get("chosen")))
    # an earlier engine's, stored by a study that began with it
    parts = []
    if outcome["probed_loader"]:
        parts.append(text.loader_text(outcome["loader"]) + _unrun_loaders(outcome))
    reference, *narrower = outcome["speed"] or [None]
    for precision in narrower:
        verdict = "kept" if precision in outcome["precisions"] else "removed"
        parts.append(
            f"{precision} {verdict} ({outcome['speed'][precision]:.2f}x the speed of {reference})"
        )
    # older studies did not store it
    at = f" at batch {outcome['batch_size']}" if "batch_size" in outcome else ""
    memory = outcome.get("checkpointing")
    return (
        f"Systems probe ({len(outcome['runs'])} short runs{at}, "
        f"{outcome['seconds']:.1f} s of training{_kept(outcome)}): "
        + ("; ".join(parts) if parts else "nothing to settle")
        + load_note(outcome)
        + (f"\n{text.checkpointing_text(memory)}" if memory else "")
    )


def _unrun_loaders(outcome: Mapping[str, Any]) -> str:
    """The loader settings none of whose runs finished (out of memory, or an error), if any."""
    finished: dict[str, bool] = {}
    for entry in outcome["runs"]:
        if "num_workers" in entry:
            name = text.loader_text(loader_of(entry))
            finished[name] = finished.get(name, False) or math.isfinite(entry["seconds"])
    unrun = [name for name, ran in finished.items() if not ran]
    return f" ({'; '.join(unrun)}: no run finished, out of memory or an error)" if unrun else ""


def load_note(record: Mapping[str, Any], *, chose: bool = True) -> str:
    """What a systems measurement's record says of other processes' load while it ran: nothing
    on a quiet machine (or a record from before it was measured). `chose`: whether it chose
    anything for the load to have swayed."""
    cores, of = record.get("other_cores"), record.get("cores")
    if cores is None or cores < BUSY_CORES:
        return ""
    return f"; other processes kept {cores:.1f} of {of} cores busy meanwhile" + (
        ", so these choices suit that load, not a quiet machine" if chose else ""
    )


def _kept(outcome: Mapping[str, Any]) -> str:
    """How many of its runs an earlier run of the probe, cut short, had made."""
    kept = outcome.get("kept_measurements")
    return f"; {kept} of them kept from a run cut short" if kept else ""
