"""The joint probe's stored outcome read back (study/roofline_probe.py writes it): a setting's
one-off costs as measured apart, and the chosen setting at each micro-batch measured, its own
batch among them. Plain mappings in, plain values out: the report, TensorBoard and the
benchmarks read the figures through here, whatever version of autotune stored them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.search.roofline import MEASURED_FORMATS

# The chosen setting's figures at one micro-batch (study/chosen_setting.py), beside its batch.
AT_BATCH = ("loader_rate", "compute_rate", "predicted", "expected", "bottleneck")


def start_up_seconds(outcome: Mapping[str, Any], setting: Mapping[str, Any]) -> float:
    """`setting`'s one-off costs as the joint probe measured them apart: its loader's start-up
    beyond its rate, and its step's (0 where a figure is missing)."""
    loader = _matching(outcome.get("loader_rates", []), setting)
    step = _matching(outcome.get("compute_rates", []), setting)
    return ((loader or {}).get("fixed_seconds") or 0.0) + ((step or {}).get("fixed_seconds") or 0.0)


def by_batch(outcome: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The chosen setting at each micro-batch measured, by batch: AT_BATCH's figures,
    `fixed_seconds` (its start-up there), `peak_memory_bytes` (CUDA), or `oom` and a `reason`
    where it has no figure. At the probe's own batch, `expected` is the speed measured end to
    end. Empty where nothing was chosen; the probe's batch alone for an outcome stored before
    the other batches were measured."""
    chosen = outcome.get("chosen")
    if not chosen or not chosen.get("measured"):
        return {}
    step = _matching(outcome.get("compute_rates", []), chosen) or {}
    own = {
        **{k: chosen.get(k) for k in AT_BATCH},
        "expected": chosen["measured"],
        "fixed_seconds": start_up_seconds(outcome, chosen),
        "peak_memory_bytes": step.get("peak_memory_bytes"),
    }
    entries = {e["batch_size"]: dict(e) for e in outcome.get("batches") or []}
    return dict(sorted({**entries, outcome["batch_size"]: own}.items()))


def _matching(rates: Sequence[Mapping[str, Any]], setting: Mapping[str, Any]) -> Any:
    """The first of `rates` whose settings agree with `setting` on every knob both name (a
    compute rate names the precision and formats, a loader rate the loader's knobs)."""
    knobs = {"num_workers", "prefetch_factor", "pin_memory", "precision", *MEASURED_FORMATS}
    for rate in rates:
        shared = (set(rate) & set(setting)) & knobs
        if all(rate[k] == setting[k] for k in shared):
            return rate
    return None
