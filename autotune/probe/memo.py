"""A probe's measurements (the joint probe's, the systems probe's short runs, the throughput
phase's) and the confirmation's runs kept in the study as each one ends, so that a probe or a
confirmation cut short (Ctrl-C, a kill, a machine's time limit) goes on where it stopped when the
same command runs again: on a GPU host each takes minutes, much of a short study.

A measurement is kept under a digest of what it measured: the measuring function, its arguments
(the settings, the rounds), the device, the seed, this host, the autotune and torch versions, and
the fields of the figures kept. A run that would measure anything else (another space, host or
version) measures afresh. The probe's choices follow from its measurements alone, so a resumed
probe asks for the same ones in the same order (a measurement asked for again, as in rounds, is
another), takes them from the study, and measures from the one that was cut short. They are kept
until the outcome they serve is stored. Each is kept with the seconds it took, so that the study's
time spent counts them once, whichever run measured them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from autotune import __version__, signals
from autotune.probe.rates import Rate
from autotune.probe.throughput import Throughput
from autotune.record import schema

# What a measurement returns, by name: a mapping of its keys to one of these.
_KINDS: dict[str, type] = {kind.__name__: kind for kind in (Rate, Throughput)}
# their fields, in every digest: a figure kept by code that stored other fields is measured again
_LAYOUT = {name: [f.name for f in dataclasses.fields(kind)] for name, kind in _KINDS.items()}


class Memo:
    """The measurements of one study's probe: those kept by an earlier run, and each new one
    written to the study as it ends. Without a study, nothing is kept."""

    def __init__(self, study: Any = None) -> None:
        self.study = study
        self.kept = dict(schema.probe_so_far(study.user_attrs)) if study is not None else {}
        self.recalled = 0  # measurements taken from an earlier run
        self.recalled_seconds = 0.0  # what they took there
        self.asked: dict[str, int] = {}  # how often each measurement was asked for so far

    def counted(self) -> dict[str, int]:
        """What an outcome says of the measurements taken from an earlier run: nothing where
        none were."""
        return {"kept_measurements": self.recalled} if self.recalled else {}

    def measured(self, measure: Callable[..., Any], work: Any, *args: Any, **where: Any) -> Any:
        """`measure(work, *args, **where)`, or what it returned in an earlier run of this probe.
        `work`: the measuring function, or a name for what `measure` does; `where`: the device
        and the seed, as `measure` takes them."""
        key = _digest(work, (*args, sorted(where.items())))
        if key is not None:  # the same measurement again (a round of several) is another one
            self.asked[key] = self.asked.get(key, 0) + 1
            key = f"{key}.{self.asked[key]}"
        if key is not None and key in self.kept:
            self.recalled += 1
            self.recalled_seconds += self.kept[key].get("seconds", 0.0)
            return _loaded(self.kept[key])
        started = time.monotonic()
        value = measure(work, *args, **where)
        stored = _stored(value)
        if self.study is not None and key is not None and stored is not None:
            self.kept[key] = {**stored, "seconds": time.monotonic() - started}
            with signals.writing():  # inside the probe's interruptible block
                schema.record_probe_so_far(self.study, self.kept)
        return value


def _digest(work: Any, args: tuple[Any, ...]) -> str | None:
    """What the measurement measures, as a digest; None where an argument has no plain form."""
    try:
        what = _plain([work, *args])
    except TypeError:
        return None
    where = [platform.node(), __version__, torch.__version__, _LAYOUT]
    text = json.dumps([what, where], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    """`value` as JSON values that are the same in every process: a set's order (string hashes
    differ between processes) and a mapping's are sorted, a function is its name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return [type(value).__qualname__, _plain(fields)]
    if isinstance(value, Mapping):
        return sorted([_plain(k), _plain(v)] for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.device):
        return str(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    raise TypeError(f"no plain form for {type(value).__name__}")


def _stored(value: Any) -> dict[str, Any] | None:
    """A measurement's result as JSON values: a list of numbers, a mapping of string keys to one
    kind of figure, or one of JSON values alone (a run's record); None for anything else, which
    is then not kept."""
    if isinstance(value, list) and all(v is None or isinstance(v, (int, float)) for v in value):
        return {"kind": "numbers", "values": value}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return None
    kinds = {type(v).__name__ for v in value.values()}
    if not kinds & set(_KINDS):
        try:  # a mapping with no figure in it: kept as its JSON form, where it has one
            return {"kind": "plain", "values": json.loads(json.dumps(value))}
        except (TypeError, ValueError):
            return None
    if len(kinds) != 1:
        return None
    return {"kind": kinds.pop(), "values": {k: dataclasses.asdict(v) for k, v in value.items()}}


def _loaded(stored: Mapping[str, Any]) -> Any:
    if stored["kind"] == "numbers":
        return list(stored["values"])
    if stored["kind"] == "plain":
        return dict(stored["values"])
    kind = _KINDS.get(stored["kind"])
    return {k: kind(**v) for k, v in stored["values"].items()} if kind else {}
