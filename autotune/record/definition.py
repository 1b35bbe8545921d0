"""What a study's stored trials were measured under, and what changed since.

A study's trials are comparable only while the task, the target, the search space, the
per-trial limits and the device stay the same. The definition is stored with the study when it
begins; a later run whose study file changes any of these is refused (before anything is
written) unless the user says to go on. The trial budget, the timeout, the seed, the baseline and
the confirmation settings may change freely: they don't change what a stored trial means.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from autotune.search.space import SCHEDULE, Choices, Domain, Space, absent_domain
from autotune.spec.study_file import TIME_TO_TARGET, StudySpec

# Keys a definition leaves out at these values, so that studies stored before they existed still
# match; a change reads them as these.
LEFT_OUT = {"objective": {"name": TIME_TO_TARGET, "replicates": 1}, "devices_per_trial": 1}


def for_spec(spec: StudySpec, *, space: Space, device: str) -> dict[str, Any]:
    """The definition as plain JSON values, from the space as fitted to the device."""
    budget = spec.budget
    definition = {
        "task": spec.task if isinstance(spec.task, str) else spec.task.describe(),
        "target": spec.target.as_record(),
        # A knob fixed at what studies begun before it existed meant by its absence (a schedule of
        # max_epochs; a systems knob off) is left out, so that their stored definitions still match.
        "space": {
            name: _domain(domain)
            for name, domain in space.domains
            if not _as_if_absent(name, domain, budget.max_epochs)
        },
        "limits": {
            "max_epochs": budget.max_epochs,
            "max_seconds": budget.max_seconds,
            "eval_every": budget.eval_every,
        },
        "device": device,
    }
    # absent when there are none, so studies begun before parameters existed still match
    if space.params:
        definition["params"] = {name: _domain(domain) for name, domain in space.params}
    optional = {
        "objective": {"name": spec.objective, "replicates": spec.replicates},
        "devices_per_trial": spec.devices_per_trial,
    }
    definition.update({k: v for k, v in optional.items() if v != LEFT_OUT[k]})
    return json.loads(json.dumps(definition))  # tuples become lists, as they come back from storage


def _as_if_absent(name: str, domain: Domain, max_epochs: float) -> bool:
    fixed = Choices((max_epochs,)) if name == SCHEDULE else absent_domain(name)
    return fixed is not None and domain == fixed


def _domain(domain: Any) -> Any:
    fields = dataclasses.asdict(domain)
    return fields["values"] if set(fields) == {"values"} else fields


def drifted(stored: dict[str, Any] | None, spec: StudySpec) -> list[str]:
    """How the study file's task, target and limits differ from those the stored study began with
    (`task: 'python:train:model' -> 'digits'`): what a report needs no device or space to check."""
    if stored is None:
        return []
    budget = spec.budget
    current = {
        "task": spec.task if isinstance(spec.task, str) else spec.task.describe(),
        "target": spec.target.as_record(),
        "limits": {
            "max_epochs": budget.max_epochs,
            "max_seconds": budget.max_seconds,
            "eval_every": budget.eval_every,
        },
    }
    return changes({key: stored.get(key) for key in current}, json.loads(json.dumps(current)))


def changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Each difference as `key: old -> new`, keys dotted as in the study file; a key left out at
    its default (LEFT_OUT) reads as that default."""
    found: list[str] = []
    _compare({**LEFT_OUT, **stored}, {**LEFT_OUT, **current}, "", found)
    return found


def _compare(old: Any, new: Any, key: str, found: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for name in [*old, *(k for k in new if k not in old)]:
            _compare(old.get(name), new.get(name), f"{key}.{name}" if key else name, found)
    elif old != new:
        found.append(f"{key}: {_show(old)} -> {_show(new)}")


def _show(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value)


def unmixable(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Knobs whose sampled domain changed in a way one Optuna study cannot hold: a different list
    of choices, or choices turned into a range (a fixed value is not sampled, so it may change)."""
    found = []
    domains = [(name, stored["space"].get(name), new) for name, new in current["space"].items()]
    domains += [
        (f"params.{name}", stored.get("params", {}).get(name), new)
        for name, new in current.get("params", {}).items()
    ]
    for name, old, new in domains:
        sampled = [
            d for d in (old, new) if isinstance(d, dict) or (isinstance(d, list) and len(d) > 1)
        ]
        if old != new and len(sampled) == 2 and not all(isinstance(d, dict) for d in sampled):
            found.append(name)
    return found
