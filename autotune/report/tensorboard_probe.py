"""The systems probe's measurements as TensorBoard event files, under DIR/probe: rates and
seconds of short measurements before the search, not learning curves.

- DIR/probe: one text summary (tag `probe/summary`, the Text tab): the report's lines on the
  probe and a table of every measurement.
- one run per setting, each figure it has at step 0:
  DIR/probe/loader/SETTING `probe/loader_rate`, DIR/probe/compute/SETTING `probe/compute_rate`
  (samples/s, measured apart), DIR/probe/end_to_end/SETTING `probe/end_to_end_predicted` and
  `probe/end_to_end_measured` (samples/s of the settings checked end to end), and DIR/probe/batches
  the chosen setting at each micro-batch measured, its batch the step: `probe/batch_loader_rate`,
  `probe/batch_compute_rate` and `probe/batch_expected` (as measured end to end there).
- a study stored by an earlier engine (short runs, one knob at a time): DIR/probe/runs/SETTING
  `probe/run_seconds`, the training-clock seconds of each of its short runs (all of the same
  samples), at the step of the run's place in the probe's order.

SETTING names the knobs, as in `num_workers=2,prefetch_factor=2,pin_memory` (a knob that is
off is left out). A setting with no rate measured apart (out of memory, say) has no run, only its
row in the table; one checked end to end but left unmeasured there (outrun before its turn) has
its predicted figure alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.probe.model.figures import AT_BATCH, by_batch
from autotune.probe.model.outcome import describe
from autotune.report import tensorboard

# A measurement's figures, apart from the knobs of the setting it measured.
RATE_FIGURES = ("samples_per_second", "spread", "windows", "fixed_seconds", "peak_memory_bytes")
# The chosen setting's figures at one micro-batch (probe/model/figures.py).
BATCH_FIGURES = ("batch_size", *(k for k in AT_BATCH if k != "bottleneck"))
NOT_KNOBS = {
    *RATE_FIGURES,
    *BATCH_FIGURES[1:],
    *("oom", "reason", "threads", "seconds", "measured", "bottleneck", "idle_share", "start_up"),
    "first_steps_seconds",
}


def write(folder: Path, outcome: Mapping[str, Any] | None, *, protected: Iterable[Path]) -> int:
    """Write the probe's measurements under `folder`/probe; the number of measured settings
    written (0, and nothing written, for a study without a probe)."""
    if not outcome:
        return 0
    tb = tensorboard.load()
    root = folder / "probe"
    joint = outcome.get("kind") == "joint"
    figures = _joint(outcome) if joint else _greedy(outcome)
    for name, points in figures.items():
        events = [
            tensorboard.scalars(tb, values, step=step, wall_time=0.0) for step, values in points
        ]
        tensorboard.write_run(tb, root / name, events, protected=protected)
    summary = tb.event(wall_time=0.0, step=0, summary=tb.text("probe/summary", _text(outcome)))
    tensorboard.write_run(tb, root, [summary], protected=protected)
    return len(figures)


Points = list[tuple[int, list[tuple[str, float | None]]]]  # (step, [(tag, value)])


def _joint(outcome: Mapping[str, Any]) -> dict[str, Points]:
    figures: dict[str, Points] = {}
    # a setting with no rate (out of memory, or left unmeasured) has no run; the summary says why
    for row in outcome.get("loader_rates", []):
        if _rate(row) is not None:
            figures[f"loader/{_name(row)}"] = [(0, [("probe/loader_rate", _rate(row))])]
    for row in outcome.get("compute_rates", []):
        if _rate(row) is not None:
            figures[f"compute/{_name(row)}"] = [(0, [("probe/compute_rate", _rate(row))])]
    for row in outcome.get("checked", []):
        figures[f"end_to_end/{_name(row)}"] = [
            (
                0,
                [
                    ("probe/end_to_end_predicted", row.get("predicted")),
                    ("probe/end_to_end_measured", _finite(row.get("measured"))),
                ],
            )
        ]
    batches = _batches(outcome)
    if batches:
        figures["batches"] = [
            (
                row["batch_size"],
                [
                    ("probe/batch_loader_rate", row.get("loader_rate")),
                    ("probe/batch_compute_rate", row.get("compute_rate")),
                    ("probe/batch_expected", row.get("expected")),
                ],
            )
            for row in batches
            if row.get("expected")
        ]
    return figures


def _batches(outcome: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chosen setting at each micro-batch measured, the probe's own among them, by batch;
    none where the probe measured no other batch."""
    if not outcome.get("batches"):
        return []
    return [{"batch_size": b, **entry} for b, entry in by_batch(outcome).items()]


def _greedy(outcome: Mapping[str, Any]) -> dict[str, Points]:
    figures: dict[str, Points] = {}
    for order, row in enumerate(outcome.get("runs", []), start=1):
        point = (order, [("probe/run_seconds", _finite(row.get("seconds")))])
        figures.setdefault(f"runs/{_name(row)}", []).append(point)
    return figures


def _name(row: Mapping[str, Any]) -> str:
    """The setting's knobs, as a folder name: `precision=bf16,channels_last,threads=4`."""
    parts = []
    for knob, value in row.items():
        if (knob in NOT_KNOBS and knob != "threads") or value is None or value is False:
            continue
        parts.append(knob if value is True else f"{knob}={value}")
    return ",".join(parts) or "default"


def _rate(row: Mapping[str, Any]) -> float | None:
    return _finite(row.get("samples_per_second"))


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _text(outcome: Mapping[str, Any]) -> str:
    """The report's lines on the probe, then every measurement as a Markdown table."""
    parts = ["  \n".join(describe(outcome).splitlines())]
    if outcome.get("kind") == "joint":
        rates = [("samples/s", "samples_per_second", _number), ("spread", "spread", _share)]
        rates += [("start-up s", "fixed_seconds", _seconds), ("note", "reason", str)]
        parts += [
            "Loader rates (the Dataset through the DataLoader, batches copied to the device):",
            _table(outcome.get("loader_rates", []), rates),
            "Compute rates (forward, backward and step on batches already on the device):",
            _table(outcome.get("compute_rates", []), [("threads", "threads", str), *rates]),
            "Checked end to end (samples/s):",
            _table(
                outcome.get("checked", []),
                [
                    ("predicted", "predicted", _number),
                    ("measured", "measured", _number),
                    ("note", "reason", str),
                ],
            ),
        ]
        if outcome.get("batches"):
            parts += [
                "The chosen setting by micro-batch (samples/s; expected: as measured end to "
                "end, else the prediction scaled as the end-to-end check found):",
                _table(
                    _batches(outcome),
                    [(key.replace("_", " "), key, _number) for key in BATCH_FIGURES[1:]]
                    + [("bottleneck", "bottleneck", str), ("note", "reason", str)],
                    first=("batch_size",),
                ),
            ]
    elif outcome.get("runs"):
        rows = [{"run": n, **row} for n, row in enumerate(outcome["runs"], start=1)]
        batch = outcome.get("batch_size")
        head = f"Short runs at batch {batch}" if batch else "Short runs"
        parts += [
            f"{head}, in the order they ran (training-clock seconds):",
            _table(rows, [("seconds", "seconds", _seconds)], first=("run",)),
        ]
    return "\n\n".join(parts)


Column = tuple[str, str, Callable[[Any], str]]  # (heading, key, format)


def _table(
    rows: Sequence[Mapping[str, Any]], figures: Sequence[Column], *, first: Sequence[str] = ()
) -> str:
    """A Markdown table: the knobs the rows name, then `figures`; a missing figure is blank."""
    if not rows:
        return "(none measured)"
    shown = {key for _, key, _ in figures}
    named = (k for r in rows for k in r if k not in NOT_KNOBS and k not in shown)
    knobs = list(dict.fromkeys([*first, *named]))
    head = [*knobs, *(heading for heading, _, _ in figures)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [_plain(row.get(k)) for k in knobs]
        cells += [fmt(row[key]) if row.get(key) is not None else "" for _, key, fmt in figures]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plain(value: Any) -> str:
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _number(value: float) -> str:
    return f"{value:,.0f}" if math.isfinite(value) else str(value)


def _share(value: float) -> str:
    return f"{value:.1%}"


def _seconds(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "failed"
