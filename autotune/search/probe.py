"""The systems probe: settle the knobs that change speed but not the maths before the search.

DataLoader workers, prefetching and pinning change how fast a step runs, never what it computes;
a narrower precision changes both, but it can only be worth its risk to convergence where it
runs faster. Measuring those over a short window of training (half an epoch, or the trial budget if
shorter) costs far less than spending whole training runs on them, so the study
(benchmarks/search.py):

1. runs the baseline's maths (lr, schedule, batch) under each loader setting of the space, and
   fixes the loader knobs to the simplest setting within `FASTER_BY` of the fastest;
2. runs each precision of the space under that loader setting, and keeps a narrower precision
   only where it is at least `FASTER_BY` faster than the widest one in the space.

Both steps run at the largest micro-batch of the space that still gives `MIN_STEPS` steps in a
probe run (the baseline's when none does, or when that one fails, say out of memory): the busier
the accelerator, the more it asks of the loader and the more a narrower precision saves. At the
baseline's 32 samples a GPU waits on kernel launches, not on data or arithmetic, and the probe
would settle on no loader workers and fp32 for a search whose winners run ten times the batch.

Each setting runs `ROUNDS` times, interleaved, and counts by its fastest run (the usual estimate
of a throughput, least disturbed by other load). The training clock of a probe run includes the
loader's start-up, so worker start-up counts against workers as it does in a trial.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

from autotune.search import roofline_text
from autotune.search.knob import PRECISIONS
from autotune.search.space import NO_LOADER, Choices, Range, Space, loader_of

ROUNDS = 2
PROBE_EPOCHS = 0.5  # at most: a trial budget shorter than this is used instead
FASTER_BY = 0.05  # less than this is noise: a narrower precision or a busier loader must beat it
MAX_LOADER_SETTINGS = 24  # more than this and the loader knobs are left to the search
# optimizer steps in a probe run: fewer, and start-up and the first steps dominate it
MIN_STEPS = 20


def _values(domain: Any) -> list[Any]:
    if isinstance(domain, Choices):
        return list(domain.values)
    assert isinstance(domain, Range)  # loader knobs are whole numbers
    return list(range(int(domain.low), int(domain.high) + 1))


def loader_settings(space: Space) -> list[dict[str, Any]]:
    """Every distinct loader setting the space allows (prefetch_factor only with workers), then
    the training set on the device (no DataLoader) where the space allows it."""
    settings = []
    if False in space["data_on_device"].values:
        for workers, pin in itertools.product(
            _values(space["num_workers"]), _values(space["pin_memory"])
        ):
            prefetches = _values(space["prefetch_factor"]) if workers > 0 else [None]
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


# a configuration -> training-clock seconds of a short run
RunProbe = Callable[[Mapping[str, Any]], float]


def probe_batch(space: Space, baseline: Mapping[str, Any], *, samples: int | None) -> int:
    """The micro-batch to probe at: the largest of the space with `MIN_STEPS` steps in a run of
    `samples` samples, and never below the baseline's."""
    fitting = [
        b for b in _values(space["batch_size"]) if samples is not None and samples / b >= MIN_STEPS
    ]
    return max([baseline["batch_size"], *fitting])


def run(
    measure: RunProbe, space: Space, baseline: Mapping[str, Any], *, samples: int | None = None
) -> dict[str, Any]:
    """Probe the space's loader settings and precisions with runs of `samples` samples (None:
    unknown, so at the baseline's batch); the outcome as plain JSON values."""
    # the widest is the reference
    precisions = sorted(space["precision"].values, key=lambda p: -PRECISIONS[p].bytes)
    reference = precisions[0]
    runs: list[dict[str, Any]] = []
    batch = probe_batch(space, baseline, samples=samples)

    def fastest(candidates: list[dict[str, Any]]) -> list[float]:
        best = [math.inf] * len(candidates)
        for _ in range(ROUNDS):
            for index, settings in enumerate(candidates):
                seconds = measure({**baseline, "batch_size": batch, **settings})
                runs.append({**settings, "seconds": seconds})
                best[index] = min(best[index], seconds)
        return best

    if batch != baseline["batch_size"]:
        seconds = measure({**baseline, "batch_size": batch, "precision": reference})
        runs.append({"precision": reference, "seconds": seconds})
        if not math.isfinite(seconds):
            batch = baseline["batch_size"]  # the large batch does not run here (out of memory, say)
    loaders = loader_settings(space)
    if 1 < len(loaders) <= MAX_LOADER_SETTINGS:
        times = fastest([{**s, "precision": reference} for s in loaders])
        # The simplest setting (fewest workers, then no pinning, then least prefetch: the order of
        # loader_settings) within FASTER_BY of the fastest: a difference smaller than that is as
        # likely the machine's noise. Every setting failing (the baseline's batch runs out of
        # memory) settles nothing.
        fast_enough = [s for s, t in zip(loaders, times) if t <= min(times) * (1 + FASTER_BY)]
        loader = fast_enough[0] if math.isfinite(min(times)) else loader_of(baseline)
    else:
        loader = loader_of(baseline) if len(loaders) > 1 else loaders[0]
    kept = list(precisions)
    ratios: dict[str, float] = {}
    if len(precisions) > 1:
        times = fastest([{**loader, "precision": p} for p in precisions])
        if math.isfinite(times[0]):
            # > 1: faster than the reference
            ratios = {p: times[0] / t for p, t in zip(precisions, times)}
            kept = [p for p in precisions if p == reference or ratios[p] >= 1 + FASTER_BY]
    return {
        "loader": loader,
        "precisions": kept,
        "speed": ratios,
        "probed_loader": 1 < len(loaders) <= MAX_LOADER_SETTINGS,
        "batch_size": batch,
        "runs": runs,
        "seconds": sum(r["seconds"] for r in runs if math.isfinite(r["seconds"])),
    }


def restrict(space: Space, outcome: Mapping[str, Any]) -> Space:
    """The space with the loader knobs fixed and the precisions the probe kept."""
    if outcome["probed_loader"]:
        loader = outcome["loader"]
        # a study stored before data_on_device was a knob: its loader had a DataLoader
        on_device = loader.get("data_on_device", False)
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
        return roofline_text.describe(outcome) + load_note(outcome)
    parts = []
    if outcome["probed_loader"]:
        parts.append(roofline_text.loader_text(outcome["loader"]) + _unrun_loaders(outcome))
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
        + (f"\n{roofline_text.checkpointing_text(memory)}" if memory else "")
    )


def _unrun_loaders(outcome: Mapping[str, Any]) -> str:
    """The loader settings none of whose runs finished (out of memory, or an error), if any."""
    finished: dict[str, bool] = {}
    for entry in outcome["runs"]:
        if "num_workers" in entry:
            name = roofline_text.loader_text(loader_of(entry))
            finished[name] = finished.get(name, False) or math.isfinite(entry["seconds"])
    unrun = [name for name, ran in finished.items() if not ran]
    return f" ({'; '.join(unrun)}: no run finished, out of memory or an error)" if unrun else ""


BUSY_CORES = 0.25  # other processes' average use of the cores, above which a measurement says so


def load_note(record: Mapping[str, Any]) -> str:
    """What a systems measurement's record says of other processes' load while it ran: nothing
    on a quiet machine (or a record from before it was measured)."""
    cores, of = record.get("other_cores"), record.get("cores")
    if cores is None or cores < BUSY_CORES:
        return ""
    return (
        f"; other processes kept {cores:.1f} of {of} cores busy meanwhile, "
        "so these choices suit that load, not a quiet machine"
    )


def _kept(outcome: Mapping[str, Any]) -> str:
    """How many of its runs an earlier run of the probe, cut short, had made."""
    kept = outcome.get("kept_measurements")
    return f"; {kept} of them kept from a run cut short" if kept else ""
