"""The joint probe's stored outcome read back (probe/run.py writes it): a setting's
one-off costs as measured apart, the knob space's limit for a run's length, and the chosen
setting at each micro-batch measured, its own batch among them. Plain mappings in, plain values
out: the report, TensorBoard and the benchmarks read the figures through here, whatever version
of autotune stored them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.probe.model.decide import TIE, decide
from autotune.probe.model.roofline import MEASURED_FORMATS, Prediction, frontier
from autotune.search.recipe import training_threads
from autotune.search.space import LOADER_KNOBS, filled, loader_of

# What a compute setting names (a loader setting names LOADER_KNOBS).
STEP_KNOBS = ("precision", *MEASURED_FORMATS)
# The chosen setting's figures at one micro-batch (probe/chosen_setting.py), beside its batch.
AT_BATCH = ("loader_rate", "compute_rate", "predicted", "measured", "expected", "bottleneck")


def start_up_seconds(outcome: Mapping[str, Any], setting: Mapping[str, Any]) -> float:
    """`setting`'s one-off costs as the joint probe measured them apart: its loader's start-up
    beyond its rate, and its step's (0 where a figure is missing). Where the step shared the
    CPU's cores with the loader (`shared_cores`), its step as measured with the threads that
    loader left it."""
    steps = outcome.get("compute_rates", [])
    if outcome.get("shared_cores") and outcome.get("cores") and "num_workers" in setting:
        threads = training_threads(outcome["cores"], setting["num_workers"])
        steps = [s for s in steps if s.get("threads") in (None, threads)] or steps
    loader = _matching(outcome.get("loader_rates", []), setting)
    step = _matching(steps, setting)
    return ((loader or {}).get("fixed_seconds") or 0.0) + ((step or {}).get("fixed_seconds") or 0.0)


def set_bytes(outcome: Mapping[str, Any], setting: Mapping[str, Any]) -> int:
    """The bytes the training set's copy takes on the device where `setting` keeps one there, as
    its gather's measurement held them (its peak: the copy and a batch); 0 where it keeps none,
    or off CUDA, where nothing is copied."""
    if not loader_of(setting)["data_on_device"]:
        return 0
    kept = [r for r in outcome.get("loader_rates", []) if loader_of(r)["data_on_device"]]
    return max((r.get("peak_memory_bytes") or 0 for r in kept), default=0)


def first_steps_seconds(outcome: Mapping[str, Any]) -> float | None:
    """What a measuring process's first steps loaded (CUDA's libraries and first kernels), beyond
    what a later step of the same took; in no setting's start-up. None where unmeasured (a probe
    measured in a process that had taken them, or stored before the figure was)."""
    figures = [r.get("first_steps_seconds") for r in outcome.get("compute_rates", [])]
    return max((f for f in figures if f is not None), default=None)


def limit_for(outcome: Mapping[str, Any], samples: float) -> dict[str, Any] | None:
    """The knob space's limit for a run of `samples`: of the settings the probe kept as best for
    some run length (`frontier`), the one predicted to take the least time, start-up measured
    apart + `samples` / its predicted rate: its figures, with `start_up`, `seconds`, and
    `fastest` (the frontier's first, the fastest rate: for a long enough run, the limit). None
    without a limit."""
    timed = [
        {
            **entry,
            "start_up": (start := start_up_seconds(outcome, entry)),
            "seconds": start + samples / entry["predicted"],
            "fastest": index == 0,
        }
        for index, entry in enumerate(frontier_of(outcome))
    ]
    return min(timed, key=lambda entry: entry["seconds"], default=None)


def setting_for_run(
    outcome: Mapping[str, Any], samples: float, current: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Of the settings the joint probe measured end to end at `current`'s precision, the one
    soonest over a run of `samples` (its start-up measured apart + samples / its measured speed;
    decide.decide): its loader and step knobs, where it finishes that run more than TIE sooner
    than `current`'s setting. None where it does not, `current`'s setting was not checked, or the
    outcome stored no start-ups (an older one)."""
    checked = [
        entry
        for entry in outcome.get("checked", [])
        if entry.get("measured") and "start_up" in entry and "compute_rate" in entry
        if entry["precision"] == current.get("precision")
    ]
    now = checked_entry({"checked": checked}, current)
    if now is None:
        return None
    picked, speed = decide(
        [
            (
                Prediction(
                    loader_of(entry),
                    {k: entry[k] for k in STEP_KNOBS if k in entry},
                    entry["loader_rate"],
                    entry["compute_rate"],
                ),
                entry["measured"],
                entry["start_up"],
            )
            for entry in checked
        ],
        samples=samples,
    )
    sooner = checked_entry({"checked": checked}, picked.setting)
    assert sooner is not None, "decide picks among the entries given"
    if now["start_up"] + samples / now["measured"] <= (1 + TIE) * (
        sooner["start_up"] + samples / speed
    ):
        return None  # as soon within the windows' noise: no reason to move
    return picked.setting


def checked_entry(outcome: Mapping[str, Any], setting: Mapping[str, Any]) -> Any:
    """The joint probe's end-to-end check of `setting` (its loader and step knobs), measured and
    with its start-up (an outcome stored before start-ups were has none): None where it was not
    checked."""
    measured = [e for e in outcome.get("checked", []) if e.get("measured") and "start_up" in e]
    return _matching(measured, setting)


def frontier_of(outcome: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The settings fastest for some run length, as stored; for an outcome stored before the
    probe kept them, found again from its rates where the step ran alike beside every loader (a
    GPU's), else its fastest predicted setting alone."""
    if outcome.get("frontier"):
        return outcome["frontier"]
    loaders = [r for r in outcome.get("loader_rates", []) if r.get("samples_per_second")]
    computes = [r for r in outcome.get("compute_rates", []) if r.get("samples_per_second")]
    if outcome.get("shared_cores") is False and loaders and computes:
        predictions = [
            Prediction(
                loader_of(loader),
                {k: step[k] for k in STEP_KNOBS if k in step},
                loader["samples_per_second"],
                step["samples_per_second"],
            )
            for loader in loaders
            for step in computes
        ]
        timed = [(p, start_up_seconds(outcome, p.setting)) for p in predictions]
        return [p.figures() for p, _ in frontier(timed)]
    return [outcome["limit"]] if outcome.get("limit") else []


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


def table_entries(outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The goodput table's entries (goodput.py's Entry, as JSON) from the joint probe's
    figures: the chosen setting at each micro-batch measured (by_batch), and each other precision
    it kept at each of its own (`precision_batches`, measured under goodput; at the probe's batch
    its end-to-end check, where it had one), at the chosen loader and formats, uncompiled: the
    speed to expect there, after its start-up; a batch out of memory as one. Then, where the
    probe kept torch.compile, the chosen setting compiled at the probe's batch, its compile on its
    start-up. Empty where nothing was chosen."""
    chosen = outcome.get("chosen")
    if not chosen or not chosen.get("measured"):
        return []
    knobs = {k: chosen[k] for k in (*LOADER_KNOBS, *STEP_KNOBS) if k in chosen}
    base = {**knobs, "compile": False, "checkpointing": filled(chosen)["checkpointing"]}
    at = by_batch(outcome)
    rows = [(chosen["precision"], batch, e) for batch, e in at.items()]
    for e in outcome.get("precision_batches") or []:
        # at the probe's batch, what its own end-to-end check measured, where it had one
        check = checked_entry(outcome, {**knobs, "precision": e["precision"]})
        if check is not None and e["batch_size"] == outcome["batch_size"]:
            e = {**e, "expected": check["measured"], "fixed_seconds": check["start_up"]}
        rows.append((e["precision"], e["batch_size"], e))
    entries = [
        {
            "settings": {**base, "precision": precision, "batch_size": batch},
            "speed": (
                {
                    "samples_per_second": e["expected"],
                    "fixed_seconds": e.get("fixed_seconds") or 0.0,
                }
                if e.get("expected")
                else None
            ),
            "oom": bool(e.get("oom")),
        }
        for precision, batch, e in rows
    ]
    own = at[outcome["batch_size"]]
    faster = compiled_speed(outcome, own["fixed_seconds"], own["expected"])
    if (outcome.get("compile") or {}).get("kept") and faster is not None:
        start_up, rate = faster
        entries.append(
            {
                "settings": {**base, "compile": True, "batch_size": outcome["batch_size"]},
                "speed": {"samples_per_second": rate, "fixed_seconds": start_up},
                "oom": False,
            }
        )
    return entries


def compiled_speed(
    outcome: Mapping[str, Any], start_up: float, rate: float
) -> tuple[float, float] | None:
    """The chosen setting's start-up and rate at the probe's batch (`start_up`, `rate`) with
    torch.compile as the probe weighed it: its compile once, then its step's gain at the chosen
    loader. None where it was not weighed."""
    compiled = outcome.get("compile") or {}
    if not compiled.get("faster"):
        return None
    return start_up + compiled["once_seconds"], rate * compiled["faster"] / compiled["speed"]


def _matching(rates: Sequence[Mapping[str, Any]], setting: Mapping[str, Any]) -> Any:
    """The first of `rates` whose settings agree with `setting` on every knob both name (a
    compute rate names the precision and formats, a loader rate the loader's knobs)."""
    knobs = {*LOADER_KNOBS, *STEP_KNOBS}
    for rate in rates:
        shared = (set(rate) & set(setting)) & knobs
        if all(rate[k] == setting[k] for k in shared):
            return rate
    return None
