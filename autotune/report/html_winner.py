"""The winner's section of the HTML page: its headline, its time beside the baseline's, and its
settings, hardware and per-class tables.

Every number here carries `data-json`, the path of the value it shows in `autotune report
--json`, so a test can check the two agree.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from autotune.record.summary import Summary, counted, plural
from autotune.report import winner


def section(summary: Summary) -> str:
    """Who won and in what time, the baseline's time beside it, and the winner's tables."""
    best = summary.best
    if best is None:
        return (
            '<section class="winner" id="winner"><h2>Winner</h2>'
            "<p>No trial has reached the target yet.</p></section>"
        )
    who = "the baseline" if best.is_baseline else best.label
    timing = (
        f"{_number('best.time_to_target', best.time_to_target)} s to the target ({_e(best.source)}"
    )
    if best.min is not None:
        timing += (
            f", median of {_number('best.runs', best.runs, '.0f')} {plural('run', best.runs)}, "
            f"range {_number('best.min', best.min)}&ndash;{_number('best.max', best.max)} s"
        )
    timing += ")"
    lines = [f'<p class="headline"><b>{_e(who)}</b>: {timing}.</p>']
    base = summary.baseline
    if base and base.time_to_target is not None:
        # a trial wins only with a smaller median than the baseline's, so its speedup is above 1
        speed = (
            f" &rarr; the winner is <b>{_number('speedup', summary.speedup)}x faster</b>"
            if summary.speedup and not best.is_baseline
            else ""
        )
        lines.append(
            f"<p>The baseline takes {_number('baseline.time_to_target', base.time_to_target)} s "
            f"(median of {_number('baseline.runs', base.runs, '.0f')} "
            f"{plural('run', base.runs)}){speed}.</p>"
        )
    elif base:
        lines.append(
            "<p>The baseline reached the target in only "
            f"{_number('baseline.reached', base.reached, '.0f')} "
            f"of {_number('baseline.runs', base.runs, '.0f')} {plural('run', base.runs)} "
            f"on fresh seeds{_e(base.why_missed(summary.limits))}.</p>"
        )
    if best.is_baseline and summary.confirmation:
        lines.append(f'<p class="verdict">{_e(summary.confirmation.why_baseline())}</p>')
    elif summary.confirmation and summary.speedup:
        lines.append(
            f'<p class="verdict">{_e(summary.confirmation.lead_phrase(ratio_said=True))}</p>'
        )
    for line in (winner.prediction_line, winner.limit_line):
        said = line(winner.timing(summary), best)
        lines += [f"<p>{_e(said)}</p>"] if said else []
    settings = "".join(
        f'<tr><td class="key">{_e(k)}</td><td>{_setting(k, v)}</td></tr>'
        for k, v in best.params.items()
    )
    columns = [f'<div><h3>Settings</h3><table id="winner-settings">{settings}</table></div>']
    columns.append(_telemetry(best.telemetry))
    columns.append(_per_class(best.per_class))
    return (
        f'<section class="winner" id="winner"><h2>Winner</h2>{"".join(lines)}'
        f'<div class="cols">{"".join(columns)}</div></section>'
    )


def _telemetry(figures: Mapping[str, Any] | None) -> str:
    if not figures:
        return ""
    where = (
        f"median of {counted(figures['runs'], 'confirmation run')}"
        if figures["source"] == "confirmation"
        else f"{figures['source']}'s run"
    )
    rows = [
        (
            "samples / s (after warm-up)",
            _number("best.telemetry.samples_per_second", figures["samples_per_second"], ".0f"),
        ),
        (
            "waiting for input",
            _number(
                "best.telemetry.input_wait", figures["input_wait"], ".1f", scale=100, unit=" %"
            ),
        ),
        (
            "peak memory",
            _number("best.telemetry.peak_memory_mb", figures["peak_memory_mb"], ".0f", unit=" MiB"),
        ),
    ]
    gpu = figures.get("gpu") or {}
    if gpu:
        path = "best.telemetry.gpu"
        rows += [
            (
                "GPU utilisation, mean / max",
                f"{_number(path + '.util_mean', gpu['util_mean'], '.0f')} / "
                f"{_number(path + '.util_max', gpu['util_max'], '.0f')} %",
            ),
            (
                "GPU memory used, peak",
                _number(
                    path + ".memory_used_peak_mb", gpu["memory_used_peak_mb"], ".0f", unit=" MiB"
                ),
            ),
            (
                "GPU power, mean / max",
                f"{_number(path + '.power_mean_w', gpu['power_mean_w'], '.0f')} / "
                f"{_number(path + '.power_max_w', gpu['power_max_w'], '.0f')} W",
            ),
        ]
    else:
        rows.append(("GPU figures", "none (no NVIDIA GPU)"))
    body = "".join(f'<tr><td class="key">{_e(k)}</td><td>{v}</td></tr>' for k, v in rows)
    return f'<div><h3>Hardware ({_e(where)})</h3><table id="winner-telemetry">{body}</table></div>'


def _per_class(per_class: Mapping[str, Any] | None) -> str:
    if not per_class:
        return ""
    where = (
        f"{counted(per_class['runs'], 'confirmation run')} pooled"
        if per_class["source"] == "confirmation"
        else "the trial's run"
    )
    rows = []
    for i, row in enumerate(per_class["classes"]):
        path = f"best.per_class.classes.{i}"
        cells = "".join(
            f"<td>{_number(f'{path}.{k}', row[k], '.3f')}</td>"
            for k in ("precision", "recall", "f1")
        )
        support = _number(f"{path}.support", row["support"], ".0f")
        rows.append(f'<tr><td class="key">{_e(row["class"])}</td>{cells}<td>{support}</td></tr>')
    head = (
        '<tr><th class="key">class</th>'
        "<th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>"
    )
    return (
        f"<div><h3>Validation set, per class ({_e(where)})</h3>"
        f'<table id="winner-per-class">{head}{"".join(rows)}</table></div>'
    )


def _number(path: str, value: Any, spec: str = ".2f", *, scale: float = 1.0, unit: str = "") -> str:
    """A number of the summary as `format(value * scale, spec)`, tagged with its path in
    `report --json` and how it was formatted, so that the two can be checked against each other."""
    if value is None:
        return "-"
    scaled = f' data-scale="{scale:g}"' if scale != 1 else ""
    return (
        f'<span data-json="{path}" data-format="{spec}"{scaled}>'
        f"{format(value * scale, spec)}</span>{unit}"
    )


def _setting(name: str, value: Any) -> str:
    """A setting as the exports give it: numbers to 4 significant digits, names as they are."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(f"best.params.{name}", value, ".4g")
    return _e(value)


def _e(value: Any) -> str:
    return html.escape(str(value))
