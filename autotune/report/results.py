"""Trial records as a pandas table, and which of them is best.

Reads finished trials (Optuna's FrozenTrial, duck-typed) and nothing else, so every report can
be made from the storage alone.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from autotune.record import derived, schema
from autotune.search.knob import DDP_NAMES
from autotune.search.space import KNOBS

# NVML figures (telemetry.gpu_summary) as columns, named gpu_<figure>; empty without an NVIDIA GPU
GPU_FIGURES = ("util_mean", "util_max", "memory_used_peak_mb", "power_mean_w", "power_max_w")
GPU_COLUMNS = tuple(f"gpu_{figure}" for figure in GPU_FIGURES)
COLUMNS = (
    "number",
    "state",
    "feasible",
    "seconds",
    "runs",
    "time_to_target",
    "samples_to_target",
    "best_metric",
    "final_metric",
    "objective_metric",
    "train_seconds",
    "epochs",
    "optimizer_steps",
    "samples_per_second",
    "input_wait",
    "peak_memory_mb",
    *GPU_COLUMNS,
    "oom",
    "oom_bound",
    "too_large",
    "diverged",
    "interrupted",
    "reason",
    "baseline",
    "devices",
)


def looks_like_trials_csv(text: str) -> bool:
    """Whether `text` is a trial table that `autotune report --csv` wrote: its header's first
    columns."""
    return text.startswith(",".join(COLUMNS[:4]) + ",")


def knobs_shown(study_attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The knobs a study's training reads, in KNOBS order: all of them unless it stored them;
    DistributedDataParallel's only where its trials trained on several devices."""
    stored = schema.knobs_read(study_attrs)
    several = schema.devices_per_trial(study_attrs) != 1
    return tuple(
        k for k in KNOBS if (stored is None or k in stored) and (several or k not in DDP_NAMES)
    )


def trial_records(trials: Iterable[Any], *, knobs: Iterable[str] = tuple(KNOBS)) -> pd.DataFrame:
    """One row per trial: its outcome, its measurements, each of `knobs` and every parameter."""
    rows, params = [], {}  # params: the user's own parameters' names, in order of appearance
    shown = tuple(knobs)
    for trial in trials:
        if schema.is_surplus(trial):  # never ran: a worker's ask after the budget was taken
            continue
        config = schema.trained_config(trial) or {k: trial.params.get(k) for k in KNOBS}
        config = {k: v for k, v in config.items() if k in shown or k not in KNOBS}
        params.update(dict.fromkeys(k for k in config if k not in KNOBS))
        rows.append({**_row(trial), **config})
    table = pd.DataFrame(rows, columns=[*COLUMNS, *shown, *params])
    for name in (*shown, *params):
        # As stored: a column with a gap (a trial that failed before its configuration was chosen)
        # would otherwise turn whole numbers into floats, and batch_size 64 into 64.0 in exports.
        table[name] = pd.Series([row.get(name) for row in rows], index=table.index, dtype=object)
    return table


def _row(trial: Any) -> dict[str, Any]:
    """A trial's outcome and measurements: its values of COLUMNS."""
    attrs = schema.stored_end(trial)
    interrupted = schema.is_interrupted(trial)
    peak = attrs.get("peak_memory_bytes")
    return {
        "number": trial.number,
        "state": trial.state.name,
        "feasible": derived.is_feasible(trial),
        # what the study minimized: the mean over the trial's runs of its time to target, or
        # of its whole schedule (study/objective.py); the first run's own figures follow
        "seconds": getattr(trial, "value", None) if trial.state.name == "COMPLETE" else None,
        "runs": len(attrs.get("replicates") or ())
        or (1 if attrs.get("train_seconds") is not None else None),
        "time_to_target": attrs.get("time_to_target"),
        # the training samples its first run needed to reach the target: not the machine's speed
        "samples_to_target": attrs.get("samples_to_target"),
        "best_metric": attrs.get("best_metric"),
        "final_metric": attrs.get(
            "final_metric", (attrs.get("curve") or [[None, None, None]])[-1][2]
        ),
        # the metric its feasibility was judged by: the worst best over its runs, or their
        # mean final
        "objective_metric": attrs.get("objective_metric", attrs.get("best_metric")),
        "train_seconds": attrs.get("train_seconds"),
        "epochs": attrs.get("epochs"),
        "optimizer_steps": attrs.get("optimizer_steps"),
        "samples_per_second": attrs.get("samples_per_second"),
        # share of training time (after warm-up) spent waiting for the next batch:
        # input-bound when high
        "input_wait": attrs.get("input_wait_fraction"),
        "peak_memory_mb": None if peak is None else peak / 2**20,
        **{f"gpu_{figure}": (attrs.get("gpu") or {}).get(figure) for figure in GPU_FIGURES},
        "oom": attrs["oom"],
        "oom_bound": attrs["oom_bound"],  # pruned without running: a smaller one ran out of memory
        # pruned without running: its effective batch is larger than the training set
        "too_large": attrs["too_large"],
        "diverged": attrs["diverged"],  # pruned at a non-finite loss or metric
        "interrupted": interrupted,
        "reason": attrs["reason"] or ("interrupted: its worker stopped" if interrupted else None),
        # the baseline, queued as the first trial (first_trial: baseline)
        "baseline": schema.is_baseline(trial),
        # the GPUs its --workers worker had to itself
        "devices": ",".join(schema.devices(trial) or []) or None,
    }


def knob_names(records: pd.DataFrame) -> list[str]:
    """The knobs among the columns (those the study's training reads), in KNOBS order."""
    return [c for c in records.columns if c in KNOBS]


def param_names(records: pd.DataFrame) -> list[str]:
    """The user's own parameters among the columns (after the knobs)."""
    return [c for c in records.columns if c not in COLUMNS and c not in KNOBS]


def best_feasible(records: pd.DataFrame, *, count: int = 1) -> pd.DataFrame:
    """The fastest feasible trials by the study's time (`seconds`), fastest first."""
    feasible = records[records["feasible"].astype(bool)]  # an empty table's columns are untyped
    return feasible.sort_values(["seconds", "number"]).head(count)


def counts(records: pd.DataFrame) -> dict[str, int]:
    """Trials by outcome. `failed` excludes interrupted trials, which are retried."""
    state = records["state"]
    return {
        "total": int(len(records)),
        "complete": int((state == "COMPLETE").sum()),
        "feasible": int(records["feasible"].sum()),
        "pruned": int((state == "PRUNED").sum()),
        "oom": int(records["oom"].sum()),
        "oom_bound": int(records["oom_bound"].sum()),
        "too_large": int(records["too_large"].sum()),
        "diverged": int(records["diverged"].sum()),
        # stopped once they could no longer beat the best time to target (prune: incumbent)
        "past_incumbent": int(
            (
                (state == "PRUNED")
                & ~records["oom"]
                & ~records["oom_bound"]
                & ~records["too_large"]
                & ~records["diverged"]
            ).sum()
        ),
        "failed": int(((state == "FAIL") & ~records["interrupted"]).sum()),
        "interrupted": int(records["interrupted"].sum()),
        "running": int((state == "RUNNING").sum()),
    }


def all_failed(trials: Iterable[Any]) -> str | None:
    """When every finished trial failed (interrupted ones aside): how many, and the most common
    reason, which names the line of the user's code; else None."""
    finished = [t for t in trials if t.state.is_finished() and not schema.is_interrupted(t)]
    if not finished or any(t.state.name != "FAIL" for t in finished):
        return None
    reason, count = collections.Counter(
        schema.reason(t) or "no reason recorded" for t in finished
    ).most_common(1)[0]
    return (
        f"every one of the {len(finished)} trials failed, so nothing was tuned; "
        f"the most common reason ({count} of {len(finished)}): {reason}"
    )


def stored_curves(
    trials: Iterable[Any], numbers: Iterable[int], *, confirmation: Mapping[str, Any] | None = None
) -> dict[str, list[list[Any]]]:
    """`trial N` -> the curve (train seconds, epochs, metric per evaluation) of each trial in
    `numbers` that stored one, in that order; and `baseline` -> the baseline's first confirmation
    run's curve, where the confirmation kept one."""
    by_number = {t.number: schema.measured(t).get("curve") for t in trials}
    curves = {f"trial {n}": by_number[n] for n in numbers if by_number.get(n)}
    for run in (confirmation or {}).get("runs", []):
        if run["label"] == "baseline" and run.get("curve"):
            curves["baseline (confirmation run)"] = run["curve"]
            break
    return curves
