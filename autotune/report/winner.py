"""What the report says of the winner beyond its time: its hardware figures and, for a classifier,
its per-class precision, recall and F1 on the validation set.

Both come from the winner's runs on fresh seeds where it was confirmed (the figures as medians, the
confusion matrices pooled), else from the study's own run of it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autotune.probe.model.figures import (
    by_batch,
    checked_entry,
    compiled_speed,
    limit_for,
    table_entries,
)
from autotune.probe.model.text import setting_text, short
from autotune.record import classes
from autotune.record.summary import counted
from autotune.report.results import GPU_FIGURES
from autotune.search.space import KNOBS, filled


def telemetry(
    runs: Sequence[Mapping[str, Any]], row: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Throughput, input wait, peak memory (and GPU figures where measured) of the winner: medians
    over `runs` (its confirmation runs) when they carry them, else the study's trial `row` (its
    record with plain Python values, None where not measured)."""
    measured = [
        r
        for r in runs
        if r.get("samples_per_second") is not None or r.get("input_wait_fraction") is not None
    ]
    if measured:
        gpus = [r["gpu"] for r in measured if r.get("gpu")]
        return {
            "samples_per_second": _median(r.get("samples_per_second") for r in measured),
            "input_wait": _median(r.get("input_wait_fraction") for r in measured),
            "peak_memory_mb": _median(
                None if r.get("peak_memory_bytes") is None else r["peak_memory_bytes"] / 2**20
                for r in measured
            ),
            "gpu": {k: _median(g.get(k) for g in gpus) for k in GPU_FIGURES} if gpus else None,
            "runs": len(measured),
            "source": "confirmation",
        }
    if row is None:
        return None
    gpu = {k: row.get(f"gpu_{k}") for k in GPU_FIGURES}
    return {
        "samples_per_second": row.get("samples_per_second"),
        "input_wait": row.get("input_wait"),
        "peak_memory_mb": row.get("peak_memory_mb"),
        "gpu": gpu if any(v is not None for v in gpu.values()) else None,
        "runs": 1,
        "source": f"trial {int(row['number'])}",
    }


def samples_to_target(
    runs: Sequence[Mapping[str, Any]], row: Mapping[str, Any] | None
) -> float | None:
    """The training samples the winner needed to reach the target: the median over `runs` (its
    confirmation runs) that counted them, else its trial's first run's (`row`)."""
    counted_runs = [r["samples_to_target"] for r in runs if r.get("samples_to_target")]
    if counted_runs:
        return float(statistics.median(counted_runs))
    value = (row or {}).get("samples_to_target")
    return float(value) if value else None


def timing(summary: Any) -> Mapping[str, Any] | None:
    """The joint probe's figures where the report's times are times to the target, which they
    predict; None under fixed_schedule, whose times are whole schedules."""
    return None if summary.fixed_schedule else summary.probe


def limit_line(outcome: Mapping[str, Any] | None, best: Any) -> str | None:
    """The winner beside the knob space's limit as a time: its samples to the target at the
    predicted rate of the setting fastest for that many (figures.limit_for), after that
    setting's start-up, and what holds the winner there; None without a limit or a count of
    samples."""
    samples = best.samples_to_target
    if best.time_to_target is None:  # a baseline kept though it missed: no time to set beside
        return None
    limit = limit_for(outcome, samples) if outcome and samples else None
    if not limit:
        return None
    start, seconds = limit["start_up"], limit["seconds"]
    sooner = (
        ""
        if limit["fastest"]
        else f"; {setting_text(limit)}, starting sooner than the fastest rate's "
        f"{outcome['limit']['predicted']:,.0f}/s"  # the frontier's first rate
    )
    line = (
        f"At the knob space's limit ({limit['predicted']:,.0f} samples/s predicted at batch "
        f"{outcome['batch_size']}, after {short(start)} of start-up measured apart{sooner}) the "
        f"winner's {samples:,.0f} samples to the target would take {seconds:.2f} s; it took "
        f"{best.time_to_target:.2f} s, {best.time_to_target / seconds:.2f}x the limit."
    )
    expected = expected_rate(outcome, getattr(best, "params", {}))
    if expected is None:  # the winner trained elsewhere: its rate and start-up are unmeasured
        return line
    # what holds the winner from the limit, in seconds that add up to the difference (as shown:
    # the run's share is what the rounded others leave of the rounded whole)
    between = round(best.time_to_target - seconds, 2)
    rate = round(samples / expected["rate"] - samples / limit["predicted"], 2)
    start_up = round(expected["start_up"] - start, 2)
    run = between - rate - start_up
    where = f"expected at batch {expected['batch_size']}" if expected["scaled"] else "end to end"
    return (
        f"{line} The {between:.2f} s between: {rate:+.2f} s of rate (the "
        f"winner's setting {expected['rate']:,.0f} samples/s {where}, against the limit's "
        f"{limit['predicted']:,.0f} predicted from its rates apart), {start_up:+.2f} s of "
        f"start-up ({short(expected['start_up'])} against {short(start)}, each measured apart), "
        f"{run:+.2f} s the run beside its prediction."
    )


def expected_rate(
    outcome: Mapping[str, Any] | None, params: Mapping[str, Any]
) -> dict[str, Any] | None:
    """What the joint probe's figures expect of training with `params`, where it trains at the
    setting the probe chose (`at`: "chosen"): `start_up` seconds (its loader's and step's, and a
    compile's), then `rate` samples a second: measured end to end at that batch (stored before
    other batches were: their rates scaled as the end-to-end check found, `scaled`). At another
    setting the probe checked end to end (`at`: "checked"), that check's figures, at the probe's
    micro-batch only; in another precision a goodput probe kept (`at`: "precision"), its table's
    entry. None where the probe did not measure that setting at that batch (or compiled)."""
    chosen = (outcome or {}).get("chosen") or {}
    if not chosen.get("measured"):
        return None
    if _differs(chosen, params):
        checked = _checked_rate(outcome, params)
        if checked is None and not _differs(chosen, {**params, "precision": chosen["precision"]}):
            return _kept_precision_rate(outcome, params)
        return checked
    batch = params.get("batch_size")  # None: a row that shows only the knobs sampled
    there = by_batch(outcome).get(batch) or {}
    if not there.get("expected"):
        return None
    expected = {"start_up": there["fixed_seconds"], "rate": there["expected"]}
    if filled(params)["compile"]:
        faster = compiled_speed(outcome, expected["start_up"], expected["rate"])
        if faster is None or batch != outcome["batch_size"]:
            return None
        expected["start_up"], expected["rate"] = faster
    return {
        **expected,
        "batch_size": batch,
        "scaled": batch != outcome["batch_size"] and not there.get("measured"),
        "at": "chosen",
    }


def _differs(chosen: Mapping[str, Any], params: Mapping[str, Any]) -> bool:
    """Whether `params` trains at another setting than the chosen one."""
    return any(params[k] != v for k, v in chosen.items() if k in params)


def _kept_precision_rate(
    outcome: Mapping[str, Any], params: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A goodput trial's entry in the table of the probe's figures (table_entries), scaled."""
    batch = params.get("batch_size")
    wanted = (params["precision"], batch, filled(params)["compile"])
    for entry in table_entries(outcome):
        at, speed = entry["settings"], entry["speed"]
        if speed and (at["precision"], at["batch_size"], at["compile"]) == wanted:
            rate = {"start_up": speed["fixed_seconds"], "rate": speed["samples_per_second"]}
            return {**rate, "batch_size": batch, "scaled": True, "at": "precision"}
    return None


def _checked_rate(outcome: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the probe measured of another setting it checked end to end (one the trials moved to
    once one had reached the target, chosen_setting.for_run, or a precision kept beside the
    chosen one), for a trial that trained at it: at the probe's micro-batch only, uncompiled and
    checkpointed as the probe measured."""
    batch = params.get("batch_size")
    if batch != outcome["batch_size"] or filled(params)["compile"]:
        return None
    if filled(params)["checkpointing"] != filled(outcome["chosen"])["checkpointing"]:
        return None  # a run that recomputes, or one that does not, is another rate
    entry = checked_entry(outcome, params)
    if entry is None:
        return None
    rate = {"start_up": entry["start_up"], "rate": entry["measured"]}
    return {**rate, "batch_size": batch, "scaled": False, "at": "checked"}


def predicted_seconds(
    outcome: Mapping[str, Any] | None, params: Mapping[str, Any], samples: float | None
) -> float | None:
    """What the joint probe's figures predict for training `samples` with `params`
    (expected_rate); None where they predict nothing."""
    expected = expected_rate(outcome, params)
    if expected is None or not samples:
        return None
    return expected["start_up"] + samples / expected["rate"]


def predicted_column(
    outcome: Mapping[str, Any] | None, records: Iterable[Mapping[str, Any]]
) -> list[float | None] | None:
    """Each trial's predicted time for the samples its run needed (predicted_seconds), None for
    one the joint probe's figures predict nothing for; None where they predict none."""
    times = []
    for record in records:
        samples = record.get("samples_to_target")
        counted_samples = isinstance(samples, (int, float)) and math.isfinite(samples)
        # its time is a mean over its runs, its samples its first run's: not comparable
        one_run = record.get("runs") in (None, 1) or not math.isfinite(record["runs"])
        params = {k: record[k] for k in KNOBS if k in record}
        known = counted_samples and one_run
        times.append(predicted_seconds(outcome, params, samples if known else None))
    return times if any(t is not None for t in times) else None


def prediction_line(outcome: Mapping[str, Any] | None, best: Any) -> str | None:
    """The winner's time beside what the joint probe predicted for its samples at the setting it
    trained at, where the probe measured that setting (expected_rate); None elsewhere."""
    expected = expected_rate(outcome, best.params)
    seconds = predicted_seconds(outcome, best.params, best.samples_to_target)
    if expected is None or seconds is None or best.time_to_target is None:
        return None
    how = (
        f"the rates measured there, scaled as the end-to-end check at batch "
        f"{outcome['batch_size']} found"
        if expected["scaled"]
        else "measured end to end"
    )
    compiled = " and a compile" if filled(best.params)["compile"] else ""
    where = {
        "chosen": "the setting the probe chose",
        "checked": "another setting the probe checked end to end",
        "precision": f"the setting the probe chose, in {best.params.get('precision')}",
    }[expected["at"]]
    return (
        f"Predicted at {where} ({expected['rate']:,.0f} samples/s at batch "
        f"{expected['batch_size']}, {how}, after {short(expected['start_up'])} of start-up"
        f"{compiled}): {seconds:.2f} s for the winner's {best.samples_to_target:,.0f} samples; "
        f"it took {best.time_to_target:.2f} s ({best.time_to_target / seconds - 1:+.0%})."
    )


def pooled_per_class(
    runs: Sequence[Mapping[str, Any]], trial_confusion: Sequence[Sequence[int]] | None
) -> dict[str, Any] | None:
    """Per-class figures from the confusion matrices of `runs` added up, else the trial's own; None
    where the task is no classifier (no matrix was kept)."""
    matrices = [r["confusion"] for r in runs if r.get("confusion")]
    matrix = classes.add(matrices) if matrices else trial_confusion
    if not matrix:
        return None
    return {
        "runs": len(matrices) or 1,
        "source": "confirmation" if matrices else "trial",
        "classes": classes.per_class(matrix),
    }


# share of training time spent waiting for batches above which the run is input-bound
INPUT_BOUND = 0.5


def figure_lines(figures: Mapping[str, Any] | None, quality: Mapping[str, Any] | None) -> list[str]:
    """The winner's hardware figures (`telemetry`) and per-class quality (`per_class`) as lines of
    the text report."""
    lines = []
    if figures:
        where = (
            f"median of {counted(figures['runs'], 'confirmation run')}"
            if figures["source"] == "confirmation"
            else f"{figures['source']}'s run"
        )
        parts = []
        if figures["samples_per_second"] is not None:
            parts.append(f"{figures['samples_per_second']:,.0f} samples/s after warm-up")
        if figures["input_wait"] is not None:
            parts.append(
                f"{100 * figures['input_wait']:.0f}% of training time waiting for input"
                + (" (input-bound)" if figures["input_wait"] > INPUT_BOUND else "")
            )
        if figures["peak_memory_mb"] is not None:
            parts.append(f"peak memory {figures['peak_memory_mb']:.0f} MiB")
        gpu = figures.get("gpu")
        if gpu:
            parts.append(
                f"GPU {gpu['util_mean']:.0f}% busy on average (max {gpu['util_max']:.0f}%), "
                f"{gpu['memory_used_peak_mb']:.0f} MiB used at peak, "
                f"{gpu['power_mean_w']:.0f} W on average"
            )
        if parts:
            lines.append(f"Hardware ({where}): {', '.join(parts)}.")
    if quality:
        scored = [c for c in quality["classes"] if c["f1"] is not None]
        where = (
            f"{counted(quality['runs'], 'run')} pooled"
            if quality["source"] == "confirmation"
            else "the trial's run"
        )
        if scored:
            low, high = min(scored, key=lambda c: c["f1"]), max(scored, key=lambda c: c["f1"])
            lines.append(
                f"Per class on the validation set ({where}): "
                f"F1 from {low['f1']:.3f} (class {low['class']}) "
                f"to {high['f1']:.3f} (class {high['class']}); `report --html` shows every class."
            )
    return lines


def _median(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
