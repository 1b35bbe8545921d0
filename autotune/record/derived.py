"""What follows from a study's stored values without reading a key of its own: whether a trial is
feasible, how a message names a trial, and a stored `module:function` reference as named today.

schema.py reads and writes every stored key; these look only at what it gives back and at
Optuna's own fields of a trial (its state, value and constraints).
"""

from __future__ import annotations

from typing import Any

from autotune.record import schema

# Modules that held stored `module:function` references (version 0) before they moved.
_MOVED_MODULES = {"autotune.tasks": "autotune.train.tasks"}


def is_feasible(trial: Any) -> bool:
    """Finished with a time and within its constraints: it reached the target."""
    constraints = getattr(trial, "constraints", None) or {}
    return (
        trial.state.name == "COMPLETE"
        and bool(constraints)
        and max(constraints.values()) <= 0
        and getattr(trial, "value", None) is not None
    )


def trial_label(trial: Any) -> str:
    """`trial 3`, or `trial 0 (the baseline)` for the baseline queued as a study's first trial."""
    return f"trial {trial.number}" + (" (the baseline)" if schema.is_baseline(trial) else "")


def current_reference(reference: str | None) -> str | None:
    """A stored `module:function` reference as it is named today."""
    if reference is None or ":" not in reference:
        return reference
    module, _, name = reference.partition(":")
    return f"{_MOVED_MODULES.get(module, module)}:{name}"
