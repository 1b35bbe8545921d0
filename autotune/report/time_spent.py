"""Where a study's time went, from its storage: the systems probe (and a throughput table an
earlier engine measured apart), the trials (their training clocks, their evaluations, and the
rest of their wall time: starting a process and its loader workers, building, storing) and the
confirmation. Wall seconds summed over every run of the study; trials that ran side by side
(--workers) each count in full, as each held its device. An interrupted trial is left out: one
killed is marked when the next run starts, maybe days later, and its configuration runs again
anyway."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.record import schema

# Below this many seconds in all the line speaks in seconds, above it in minutes.
MINUTES_FROM = 120


def of_study(trials: Sequence[Any], study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The study's time by part, each None where the study has none or did not record it (a
    confirmation stored before its time was); None when nothing has run."""
    ran = [
        t
        for t in trials
        if t.datetime_start is not None
        and t.datetime_complete is not None
        and not schema.is_interrupted(t)
    ]
    parts = {
        "probe": (schema.probe(study_attrs) or {}).get("seconds"),
        "throughput_table": (schema.throughput(study_attrs) or {}).get("seconds"),
        "trials": sum((t.datetime_complete - t.datetime_start).total_seconds() for t in ran)
        if ran
        else None,
        "confirmation": (schema.confirmation(study_attrs) or {}).get("seconds"),
    }
    known = [v for v in parts.values() if v is not None]
    if not known:
        return None
    on, off = zip(*map(schema.run_seconds, ran)) if ran else ((), ())
    return {
        **parts,
        "trial_count": len(ran),
        "training": float(sum(on)),
        # None: no trial said (commands evaluate on their own clock, counted as training)
        "evaluating": sum(p for p in off if p is not None) or None,
        "total": sum(known),
    }


def describe(spent: Mapping[str, Any]) -> str:
    """One line: `Time spent: 4.9 min in all: systems probe 1.2 min, 16 trials 2.5 min (training
    1.4 min, evaluating 0.3 min; starting and storing 0.8 min), confirmation 1.2 min.`"""
    minutes = spent["total"] >= MINUTES_FROM

    def amount(seconds: float) -> str:
        value, unit = (seconds / 60, "min") if minutes else (seconds, "s")
        # a part that took some time is not shown as none
        return f"under 0.1 {unit}" if 0 < value < 0.05 else f"{value:.1f} {unit}"

    shown = []
    if spent["probe"] is not None:
        shown.append(f"systems probe {amount(spent['probe'])}")
    if spent.get("throughput_table") is not None:  # measured apart by an earlier engine
        shown.append(f"throughput table {amount(spent['throughput_table'])}")
    if spent["trials"] is not None:
        evaluating = spent.get("evaluating")  # absent from a figure stored before it was
        rest = max(0.0, spent["trials"] - spent["training"] - (evaluating or 0.0))
        count = spent["trial_count"]
        inside = (
            f"training {amount(spent['training'])}, evaluating {amount(evaluating)}; "
            f"starting and storing {amount(rest)}"
            if evaluating
            else f"training {amount(spent['training'])}; evaluating, starting and storing "
            f"{amount(rest)}"
        )
        shown.append(
            f"{count} trial{'s' if count != 1 else ''} {amount(spent['trials'])} ({inside})"
        )
    if spent["confirmation"] is not None:
        shown.append(f"confirmation {amount(spent['confirmation'])}")
    return f"Time spent: {amount(spent['total'])} in all: {', '.join(shown)}."
