"""The report's plots, drawn with matplotlib from the trial records alone; each returns a Figure.

Figures are made with matplotlib's object API (no pyplot): no global state, no window, no backend
to choose, so a report can be drawn anywhere, in a test or on a machine without a screen.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from autotune.search.knob import PRECISIONS

FEASIBLE, INFEASIBLE, PRUNED, OOM, BASELINE = "#1f77b4", "#d62728", "#999999", "#d62728", "#555555"
SIZE = (6.4, 4.0)  # inches at 100 dpi: 640 x 400 pixels, two abreast on a laptop screen
ON_DEVICE = "on device"  # the throughput plot's loader for a training set kept on the device


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def _figure(title: str) -> tuple[Figure, Any]:
    figure = Figure(figsize=SIZE, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title, fontsize=11)
    axes.grid(alpha=0.3)
    return figure, axes


def _note(axes: Any, text: str) -> None:
    """Say on the plot why it is empty, rather than leave a blank frame."""
    axes.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        transform=axes.transAxes,
        color=BASELINE,
        wrap=True,
    )


def _complete(records: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The complete trials that reached the target, and those that did not."""
    done = records[records["state"] == "COMPLETE"]
    feasible = done["feasible"].astype(bool)  # an empty table's columns are untyped
    return done[feasible], done[~feasible]


def best_so_far(records: pd.DataFrame, *, baseline: float | None = None) -> Figure:
    """Each complete trial's time, and the best feasible time so far, over the trials; and the
    baseline's median time on fresh seeds, where it was confirmed."""
    figure, axes = _figure("Best time to target so far")
    if baseline is not None:
        axes.axhline(
            baseline, color=BASELINE, linestyle="--", label="baseline (median, fresh seeds)"
        )
    feasible, infeasible = _complete(records)
    axes.scatter(
        feasible["number"],
        feasible["seconds"],
        color=FEASIBLE,
        label="reached the target",
        zorder=3,
    )
    axes.scatter(
        infeasible["number"],
        infeasible["train_seconds"],
        facecolors="none",
        edgecolors=INFEASIBLE,
        label="missed it (time it ran)",
        zorder=3,
    )
    if not feasible.empty:
        best = feasible.set_index("number")["seconds"].reindex(records["number"]).cummin().ffill()
        axes.step(best.index, best.to_numpy(), where="post", color=FEASIBLE, label="best so far")
    else:
        _note(axes, "no trial reached the target")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are numbered, not measured
    axes.set_xlabel("trial")
    axes.set_ylabel("seconds of training")
    axes.legend(fontsize=8)
    return figure


def time_against_metric(records: pd.DataFrame, *, target: float, metric: str) -> Figure:
    """Time against the metric each complete trial reached: feasible ones left of nothing."""
    figure, axes = _figure(f"Time against {metric} reached")
    feasible, infeasible = _complete(records)
    axes.scatter(
        feasible["objective_metric"],
        feasible["seconds"],
        color=FEASIBLE,
        label="reached: time to target",
    )
    axes.scatter(
        infeasible["objective_metric"],
        infeasible["train_seconds"],
        facecolors="none",
        edgecolors=INFEASIBLE,
        label="missed: time it ran",
    )
    axes.axvline(target, color=BASELINE, linestyle="--", label=f"target {target:g}")
    axes.set_xlabel(f"best {metric}")
    axes.set_ylabel("seconds of training")
    axes.legend(fontsize=8)
    return figure


def importances(values: Mapping[str, float] | None, *, why_not: str = "") -> Figure:
    """Parameter importances (Optuna's evaluator), largest on top."""
    figure, axes = _figure("Parameter importance for time to target")
    if not values:
        _note(axes, why_not or "not enough complete trials")
        return figure
    names = list(values)[::-1]
    axes.barh(names, [values[n] for n in names], color=FEASIBLE)
    axes.set_xlabel("importance (share of the variance explained)")
    return figure


def learning_curves(
    curves: Mapping[str, Sequence[Sequence[Any]]], *, target: float, metric: str
) -> Figure:
    """Metric against training time for each labelled run (the best trials, and the baseline)."""
    figure, axes = _figure(f"Learning curves: {metric} against training time")
    for label, curve in curves.items():
        seconds = [point[0] for point in curve]
        values = [point[2] for point in curve]
        style = {"color": BASELINE, "linestyle": "--"} if label.startswith("baseline") else {}
        axes.plot(seconds, values, marker=".", label=label, **style)
    if not curves:
        _note(axes, "no trial trained to the end")
    axes.axhline(target, color=BASELINE, linestyle=":", label=f"target {target:g}")
    axes.set_xlabel("seconds of training (evaluation not counted)")
    axes.set_ylabel(metric)
    axes.legend(fontsize=8)
    return figure


def oom_map(records: pd.DataFrame) -> Figure:
    """Batch size against precision: where trials ran, ran out of memory, or were known to."""
    figure, axes = _figure("Out-of-memory map")
    if _unread(axes, records, "batch_size", "precision"):
        return figure
    tried = records.dropna(subset=["batch_size", "precision"])
    precisions = [p for p in PRECISIONS if p in set(tried["precision"])]
    sizes = sorted({int(b) for b in tried["batch_size"]})
    if tried.empty:
        _note(axes, "no trial has a configuration yet")
        return figure
    x = {b: i for i, b in enumerate(sizes)}
    y = {p: i for i, p in enumerate(precisions)}
    kinds = (
        ("ran", ~tried["oom"] & ~tried["oom_bound"], "o", FEASIBLE, -0.2),
        ("out of memory", tried["oom"], "X", OOM, 0.0),
        ("known to run out (not run)", tried["oom_bound"], "^", "#ff7f0e", 0.2),
    )
    for label, mask, marker, color, offset in kinds:
        cells = tried[mask].groupby(["batch_size", "precision"]).size()
        if cells.empty:
            continue
        xs = [x[int(b)] + offset for b, _ in cells.index]
        ys = [y[p] for _, p in cells.index]
        axes.scatter(
            xs,
            ys,
            s=[60 + 20 * n for n in cells],
            marker=marker,
            color=color,
            label=label,
            zorder=3,
        )
        for xi, yi, n in zip(xs, ys, cells):
            axes.annotate(
                str(n), (xi, yi), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=7
            )
    axes.set_xticks(range(len(sizes)), [str(b) for b in sizes])
    axes.set_yticks(range(len(precisions)), precisions)
    axes.set_xlim(-0.6, len(sizes) - 0.4)
    axes.set_ylim(-0.6, len(precisions) - 0.4)
    axes.set_xlabel("batch size (micro-batch; numbers: trials)")
    axes.set_ylabel("precision")
    axes.legend(fontsize=8, loc="upper left")
    return figure


def throughput_figure(records: pd.DataFrame) -> Figure:
    """Samples per second and input wait against the loader, one colour per precision."""
    figure = Figure(figsize=(SIZE[0], SIZE[1] * 1.3), layout="constrained")
    speed, wait = figure.subplots(2, 1, sharex=True)
    speed.set_title("Throughput against the loader and precision", fontsize=11)
    if _unread(speed, records, "num_workers", "precision"):
        return figure
    measured = records.dropna(subset=["samples_per_second", "num_workers"])
    if measured.empty:
        _note(speed, "no trial ran past its warm-up")
    loaders = [_loader_label(row) for _, row in measured.iterrows()]
    # the training set on the device first: it has no DataLoader, so no count of workers
    order = sorted(set(loaders), key=lambda label: -1 if label == ON_DEVICE else int(label))
    position = {label: i for i, label in enumerate(order)}
    precisions = [p for p in PRECISIONS if p in set(measured["precision"])]
    for k, precision in enumerate(precisions):
        mine = measured["precision"] == precision
        rows = measured[mine]
        xs = [
            position[label] + (k - (len(precisions) - 1) / 2) * 0.15
            for label, own in zip(loaders, mine)
            if own
        ]
        speed.scatter(xs, rows["samples_per_second"], label=precision, alpha=0.8)
        wait.scatter(xs, 100 * rows["input_wait"].astype(float), label=precision, alpha=0.8)
    speed.set_ylabel("samples / s (after warm-up)")
    wait.set_ylabel("waiting for input, %")
    wait.set_ylim(-5, 105)
    wait.set_xticks(range(len(order)), order)
    wait.set_xlabel("num_workers (DataLoader worker processes), or the training set on the device")
    for axes in (speed, wait):
        axes.grid(alpha=0.3)
    if precisions:
        speed.legend(fontsize=8, title="precision", title_fontsize=8)
    return figure


def _unread(axes: Any, records: pd.DataFrame, *knobs: str) -> bool:
    """Whether the training reads none of `knobs` (a command that never names one, an objective
    that takes none): the plot says so rather than charting what did not vary."""
    missing = [k for k in knobs if k not in records.columns]
    if missing:
        _note(axes, f"the training does not read {' or '.join(missing)}")
    return bool(missing)


def _loader_label(row: pd.Series) -> str:
    """A trial's loader on the throughput plot's axis: its workers, or ON_DEVICE."""
    on_device = row.get("data_on_device")  # absent, or None, in a study from before the knob
    if pd.notna(on_device) and bool(on_device):
        return ON_DEVICE
    return str(int(row["num_workers"]))
