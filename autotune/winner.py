"""What the report says of the winner beyond its time: its hardware figures and, for a classifier,
its per-class precision, recall and F1 on the validation set.

Both come from the winner's runs on fresh seeds where it was confirmed (the figures as medians, the
confusion matrices pooled), else from the study's own run of it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from autotune import classes
from autotune.results import GPU_FIGURES


def telemetry(runs: Sequence[Mapping[str, Any]], row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Throughput, input wait, peak memory (and GPU figures where measured) of the winner: medians
    over `runs` (its confirmation runs) when they carry them, else the study's trial `row`."""
    measured = [r for r in runs if r.get("samples_per_second") is not None or r.get("input_wait_fraction") is not None]
    if measured:
        gpus = [r["gpu"] for r in measured if r.get("gpu")]
        return {
            "samples_per_second": _median(r.get("samples_per_second") for r in measured),
            "input_wait": _median(r.get("input_wait_fraction") for r in measured),
            "peak_memory_mb": _median(None if r.get("peak_memory_bytes") is None else r["peak_memory_bytes"] / 2**20
                                      for r in measured),
            "gpu": {k: _median(g.get(k) for g in gpus) for k in GPU_FIGURES} if gpus else None,
            "runs": len(measured), "source": "confirmation",
        }
    if row is None:
        return None
    gpu = {k: _plain(row.get(f"gpu_{k}")) for k in GPU_FIGURES}
    return {
        "samples_per_second": _plain(row.get("samples_per_second")), "input_wait": _plain(row.get("input_wait")),
        "peak_memory_mb": _plain(row.get("peak_memory_mb")),
        "gpu": gpu if any(v is not None for v in gpu.values()) else None,
        "runs": 1, "source": f"trial {int(row['number'])}",
    }


def per_class(runs: Sequence[Mapping[str, Any]], trial_confusion: Sequence[Sequence[int]] | None) -> dict[str, Any] | None:
    """Per-class figures from the confusion matrices of `runs` added up, else the trial's own; None
    where the task is no classifier (no matrix was kept)."""
    matrices = [r["confusion"] for r in runs if r.get("confusion")]
    matrix = classes.add(matrices) if matrices else trial_confusion
    if not matrix:
        return None
    return {"runs": len(matrices) or 1, "source": "confirmation" if matrices else "trial", "classes": classes.per_class(matrix)}


def _median(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _plain(value: Any) -> Any:
    """A table cell as a plain Python value: None for NaN."""
    if value is None or (isinstance(value, float) and value != value) or pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value
