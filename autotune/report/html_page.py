"""The study as one self-contained HTML page: the winner, the plots, the fastest trials.

Made from stored results only (the summary, the trial records, stored learning curves and the
importances). Images are embedded as data: URIs and the page loads nothing else, so it opens
offline and can be mailed to a colleague as one file. The winner's section is html_winner.py's.
"""

from __future__ import annotations

import base64
import datetime
import html
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from autotune.probe.model import goodput, outcome
from autotune.record import importance
from autotune.record.summary import Counts, Summary, counted
from autotune.report import html_winner, plots, time_spent, winner
from autotune.report.results import best_feasible
from autotune.report.text import TABLE_ROWS, cut_short

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; \
margin: 2rem auto; max-width: 1340px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #666; margin-top: 0; }
.winner { background: #f4f8fc; border: 1px solid #cddbea; border-radius: 6px; \
padding: .5rem 1.2rem 1rem; }
.headline { font-size: 1.1rem; }
.cols { display: flex; flex-wrap: wrap; gap: 2rem; }
table { border-collapse: collapse; font-size: .85rem; }
th, td { padding: .2rem .6rem; text-align: right; border-bottom: 1px solid #e4e4e4; }
th { background: #f0f0f0; } td.key, th.key { text-align: left; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); gap: 1rem; }
figure { margin: 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .8rem; color: #555; }
.wide { max-width: 100%; overflow-x: auto; }
"""
IMPORTANCE_TRIALS = 20  # fewer complete trials than this: fANOVA's figures are a rough guide

PLOTS = (
    "best_so_far",
    "time_against_metric",
    "importances",
    "learning_curves",
    "oom_map",
    "throughput",
)


# how a page from `report --html` is known again
GENERATOR = '<meta name="generator" content="autotune">'


def looks_like_page(text: str) -> bool:
    """Whether `text` is a page that `autotune report --html` wrote."""
    return GENERATOR in text[:4096] or (
        text.lstrip().startswith("<!DOCTYPE html>") and "<title>autotune: " in text[:4096]
    )


def render(
    summary: Summary,
    records: pd.DataFrame,
    *,
    curves: Mapping[str, Sequence[Sequence[Any]]],
    importances: Mapping[str, float] | None,
    importances_missing: str = "",
) -> str:
    """The whole page as a string."""
    target = summary.target
    images = _plots(
        summary,
        records,
        curves=curves,
        importances=importances,
        importances_missing=importances_missing,
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">\
<meta name="viewport" content="width=device-width, initial-scale=1">
{GENERATOR}
<title>autotune: {_e(summary.study)}</title><link rel="icon" href="data:,">\
<style>{STYLE}</style></head>
<body>
<h1>Study {_e(summary.study)}</h1>
<p class="sub">Target: {_e(target.text)} &middot; {_counts(summary.counts)}
{_device(summary)} &middot; report made {datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}</p>
{_probe(summary)}
{html_winner.section(summary)}
{_confirmation(summary)}
<h2>Plots</h2>
<div class="plots">
{images}
</div>
<h2>Fastest trials</h2>
{_top_table(records, summary)}
</body></html>
"""


def _plots(
    summary: Summary,
    records: pd.DataFrame,
    *,
    curves: Mapping[str, Sequence[Sequence[Any]]],
    importances: Mapping[str, float] | None,
    importances_missing: str,
) -> str:
    """Every plot of PLOTS as a figure with its caption, in that order."""
    target = summary.target
    figures = {
        "best_so_far": (
            plots.best_so_far(
                records, baseline=summary.baseline.time_to_target if summary.baseline else None
            ),
            "Every complete trial's time; the line is the best feasible so far.",
        ),
        "time_against_metric": (
            plots.time_against_metric(records, target=target.value, metric=target.metric),
            "Filled: reached the target (its time to target). Hollow: missed it (how long it ran).",
        ),
        "importances": (
            plots.importances(importances, why_not=importances_missing),
            _importance_caption(records),
        ),
        "learning_curves": (
            plots.learning_curves(curves, target=target.value, metric=target.metric),
            "The fastest trials' runs, and the baseline's first confirmation run (dashed).",
        ),
        "oom_map": (
            plots.oom_map(records),
            "Where trials ran out of memory: batch size against precision.",
        ),
        "throughput": (
            plots.throughput_figure(records),
            "Samples per second after warm-up, and the share of training time "
            "spent waiting for the next batch (high: input-bound).",
        ),
    }
    return "\n".join(_figure(name, figure, caption) for name, (figure, caption) in figures.items())


def _e(value: Any) -> str:
    return html.escape(str(value))


def _figure(name: str, figure: Any, caption: str) -> str:
    data = base64.b64encode(plots.png(figure)).decode()
    return (
        f'<figure id="plot-{name}">'
        f'<img src="data:image/png;base64,{data}" alt="{_e(name.replace("_", " "))}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _counts(c: Counts) -> str:
    too_large = f", {c.too_large} larger than the training set" if c.too_large else ""
    return (
        f"{c.total} trials: {c.feasible} reached the target, {c.complete - c.feasible} missed it, "
        f"{c.pruned} pruned ({c.oom} out of memory, {c.oom_bound} known to run out{too_large}), "
        f"{c.failed} failed"
    )


def _device(summary: Summary) -> str:
    devices = summary.devices_per_trial
    several = f" &middot; {devices} devices per trial" if devices != 1 else ""
    return (f"&middot; device {_e(summary.device)}" if summary.device else "") + several


def _probe(summary: Summary) -> str:
    """What the systems probe settled (and a goodput study's table), and where the time went,
    each in a line."""
    # the joint probe's are several
    lines = outcome.describe(summary.probe).splitlines() if summary.probe else []
    lines += [goodput.describe(summary.throughput)] if summary.throughput else []
    lines += [cut_short(summary.measurements_kept)] if summary.measurements_kept else []
    lines += [time_spent.describe(summary.time_spent)] if summary.time_spent else []
    return "".join(f"<p>{_e(line)}</p>" for line in lines)


def _top_table(records: pd.DataFrame, summary: Summary) -> str:
    top = best_feasible(records, count=TABLE_ROWS * 2)
    if top.empty:
        return "<p>No trial reached the target yet.</p>"
    columns = {
        "number": "trial",
        "seconds": "seconds",
        "objective_metric": summary.target.metric,
        "epochs": "epochs",
        "samples_per_second": "samples/s",
        "input_wait": "input wait",
        "peak_memory_mb": "peak MiB",
        "lr": "lr",
        "scheduler": "scheduler",
        "batch_size": "batch",
        "accumulation_steps": "accum",
        "data_on_device": "data on device",
        "num_workers": "workers",
        "prefetch_factor": "prefetch",
        "pin_memory": "pin",
        "precision": "precision",
        "schedule_epochs": "schedule",
        "channels_last": "channels last",
        "compile": "compile",
        "cudnn_benchmark": "cudnn",
        "tf32": "tf32",
        "fused_optimizer": "fused",
        "checkpointing": "checkpointing",
        "ddp_bucket_cap_mb": "DDP bucket MB",
        "ddp_gradient_as_bucket_view": "DDP bucket view",
        "ddp_static_graph": "DDP static graph",
    }
    # DDP's knobs are columns only for a study on several devices (results.knobs_shown)
    table = top[[c for c in columns if c in top]].rename(columns=columns)
    predicted = winner.predicted_column(winner.timing(summary), top.to_dict("records"))
    if predicted is not None:  # the joint probe's figures, for its samples at its setting
        table.insert(2, "predicted", predicted)
    table["input wait"] = table["input wait"].map(
        lambda v: "-" if pd.isna(v) else f"{100 * v:.0f} %"
    )
    # Every knob a column: wider than a laptop's window, so it scrolls inside the page,
    # not the page.
    page = table.to_html(
        index=False, na_rep="-", float_format=lambda x: f"{x:.4g}", border=0, table_id="top-trials"
    )
    return f'<div class="wide">{page}</div>'


def _importance_caption(records: pd.DataFrame) -> str:
    caption = (
        "How much of the variation in the study's time each parameter explains (Optuna's fANOVA)."
    )
    complete = int((records["state"] == "COMPLETE").sum()) if "state" in records else 0
    if 0 < complete < IMPORTANCE_TRIALS:
        caption += (
            f" From only {counted(complete, 'complete trial')}: "
            "a rough guide, which more trials can reorder; "
            f"below {IMPORTANCE_TRIALS} trials do not drop a parameter on its strength."
        )
    if complete > importance.MAX_TRIALS:
        caption += (
            f" Computed over a seeded sample of {importance.sampled_from(complete):,} of the "
            f"{complete:,} complete trials (over all of them, fANOVA would take minutes)."
        )
    return caption


def _confirmation(summary: Summary) -> str:
    """The side-by-side re-measurement on fresh seeds, one row per configuration, as in the text
    report."""
    confirmation = summary.confirmation
    if not confirmation:
        return ""
    rows = []
    for label, stats in confirmation.configs.items():
        spread = (
            f"{stats['min']:.2f}&ndash;{stats['max']:.2f} s"
            if stats.get("min") is not None
            else "-"
        )
        median = "not reached" if stats.get("median") is None else f"{stats['median']:.2f} s"
        if summary.fixed_schedule:
            final = stats.get("mean_final_metric")
            last = "-" if final is None else f"{final:.4f}"
        else:
            last = f"{stats['reached']}/{stats['runs']}"
        predicted = confirmation.predicted.get(label)
        rows.append(
            f'<tr><td class="key">{_e(label)}</td><td>{median}</td><td>{spread}</td><td>{last}</td>'
            f"<td>{'-' if predicted is None else f'{predicted:.2f} s'}</td></tr>"
        )
    last_head = f"mean final {_e(summary.target.metric)}" if summary.fixed_schedule else "reached"
    judged = (
        "median time of the whole schedule"
        if summary.fixed_schedule
        else "median time to the target"
    )
    return (
        f"<h2>Re-measured side by side on {counted(len(confirmation.seeds), 'fresh seed')}</h2>"
        '<table id="confirmation">'
        f'<tr><th class="key">configuration</th><th>{judged}</th><th>range</th>'
        f"<th>{last_head}</th><th>predicted</th></tr>{''.join(rows)}</table>"
        + "".join(
            f"<p>{_e(sentence)}</p>"
            for sentence in (confirmation.precision_sentence(), confirmation.kept_sentence())
            if sentence
        )
    )
