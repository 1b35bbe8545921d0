"""The joint probe's settings screened: fewer measured for the same choice.

Loader settings (`screened_loaders`): the training set on the device first, and no DataLoader
where its gather runs GATHER_OUTPACES times the fastest step (a DataLoader, feeding the step no
faster than it runs, could gain at most FASTER_BY over it); else each worker count unpinned, then
pinned only at the worker counts that came within PIN_WITHIN of the fastest.

Compute settings (`screened`):

Every precision x memory format x toggle (cuDNN's search, TF32 with fp32, the fused step) is 32
settings on a GPU, each a model built, warmed up and timed. Most of them tell little: on an
H200 and an H100 the shapes step ran 1.4-1.8x faster channels-last at every precision, cuDNN's
search and TF32 moved no rate by more than 3%, and the fused step 1-2% at fp32 and bf16 and
9-20% at fp16 (more with channels-last, so each toggle is measured at the faster memory
format). So, where a space has more than SCREEN_ABOVE:

1. each precision with each memory format, the toggles at their base (off where the space
   allows it);
2. at each precision's faster memory format, each toggle changed alone;
3. at each precision, the toggles that each ran at least `outcome.FASTER_BY` faster, together,
   where two or more did.

On the shapes study's space that is 13 settings in place of 32; the joint probe then predicts
over the settings measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autotune.probe.model.outcome import FASTER_BY
from autotune.search.space import loader_of

SCREEN_ABOVE = 8  # compute settings measured all at once up to this many
# Pinned memory made no loader more than 10% faster (15 worker counts measured both ways on an
# H100 and an H200; several ran slower): it is measured only at the worker counts whose unpinned
# rate came this close to the fastest.
PIN_WITHIN = 0.1
# A gather on the device this many times the fastest step's rate leaves a DataLoader at most
# 1/GATHER_OUTPACES (FASTER_BY: noise) to gain: no DataLoader setting is measured.
GATHER_OUTPACES = 1 / FASTER_BY
FORMAT = "channels_last"
# setting index -> its rate (None: no figure, out of memory say)
Rates = dict[int, "float | None"]


def screened(settings: Sequence[Mapping[str, Any]], measure: Callable[[list[int]], Rates]) -> Rates:
    """The rates of the settings screening picks (all of them, up to SCREEN_ABOVE), each stage
    `measure`d in one call with the indices of `settings` it picks."""
    if len(settings) <= SCREEN_ABOVE:
        return measure(list(range(len(settings))))
    measured: Rates = {}
    for stage in (_formats, _each_toggle, _helpful_toggles):
        picked = [i for i in stage(settings, measured) if i not in measured]
        if picked:
            measured.update(measure(picked))
    return measured


def screened_loaders(
    loaders: Sequence[Mapping[str, Any]],
    measure: Callable[[list[int]], Rates],
    *,
    fastest_step: float | None = None,
) -> Rates:
    """The rates of the loader settings screening picks: the training set on the device first,
    and no DataLoader where its gather outpaces `fastest_step` (`outpaced_by_gather`); else every
    unpinned DataLoader, then the pinned ones at the worker counts whose unpinned rate came within
    PIN_WITHIN of the fastest (all of them where none ran, or the space leaves pinning no
    choice)."""
    on_device = [i for i, s in enumerate(loaders) if loader_of(s)["data_on_device"]]
    measured = measure(on_device) if on_device else {}
    if outpaced_by_gather(measured.values(), fastest_step):
        return measured
    fed = [i for i in range(len(loaders)) if i not in on_device]  # by a DataLoader
    unpinned = [i for i in fed if loaders[i]["pin_memory"] is False]
    pinned = [i for i in fed if loaders[i]["pin_memory"] is True]
    if not (unpinned and pinned):
        return {**measured, **(measure(fed) if fed else {})}
    measured.update(measure(unpinned))
    fastest = max((measured.get(i) or 0.0 for i in unpinned), default=0.0) or None
    close = {
        loaders[i]["num_workers"]
        for i in unpinned
        if fastest is None or (measured.get(i) or 0) >= (1 - PIN_WITHIN) * fastest
    }
    measured.update(measure([i for i in pinned if loaders[i]["num_workers"] in close]))
    return measured


def outpaced_by_gather(gather_rates: Iterable[float | None], fastest_step: float | None) -> bool:
    """Whether the training set on the device leaves a DataLoader nothing worth measuring: a
    DataLoader feeds the step no faster than the step runs, and a gather at GATHER_OUTPACES times
    the fastest step's rate, then the step, trains within 1 / GATHER_OUTPACES of that."""
    return bool(fastest_step) and any(
        (rate or 0.0) >= GATHER_OUTPACES * fastest_step for rate in gather_rates
    )


def _toggles(settings: Sequence[Mapping[str, Any]]) -> list[str]:
    """The knobs besides precision and memory format that take more than one value."""
    names = [k for k in settings[0] if k not in ("precision", FORMAT)]
    return [k for k in names if len({s[k] for s in settings}) > 1]


def _base(settings: Sequence[Mapping[str, Any]], knob: str) -> Any:
    return False if any(s[knob] is False for s in settings) else settings[0][knob]


def _changed(settings: Sequence[Mapping[str, Any]], setting: Mapping[str, Any]) -> set[str]:
    """The toggles `setting` has away from their base."""
    return {k for k in _toggles(settings) if setting[k] != _base(settings, k)}


def _formats(settings: Sequence[Mapping[str, Any]], _: Rates) -> list[int]:
    return [i for i, s in enumerate(settings) if not _changed(settings, s)]


def _fastest_format(settings: Sequence[Mapping[str, Any]], measured: Rates, precision: str) -> Any:
    """`precision`'s faster memory format with every toggle at its base; None unmeasured."""
    ran = [
        (measured[i], settings[i][FORMAT])
        for i in _formats(settings, measured)
        if settings[i]["precision"] == precision and measured.get(i)
    ]
    return max(ran, key=lambda pair: pair[0])[1] if ran else None


def _at_fastest_format(
    settings: Sequence[Mapping[str, Any]], measured: Rates
) -> list[tuple[int, Mapping[str, Any]]]:
    fastest = {
        p: _fastest_format(settings, measured, p) for p in {s["precision"] for s in settings}
    }
    return [(i, s) for i, s in enumerate(settings) if s[FORMAT] == fastest[s["precision"]]]


def _each_toggle(settings: Sequence[Mapping[str, Any]], measured: Rates) -> list[int]:
    return [i for i, s in _at_fastest_format(settings, measured) if len(_changed(settings, s)) == 1]


def _helpful_toggles(settings: Sequence[Mapping[str, Any]], measured: Rates) -> list[int]:
    at_format = _at_fastest_format(settings, measured)
    base = {s["precision"]: measured.get(i) for i, s in at_format if not _changed(settings, s)}
    helpful: dict[str, set[str]] = {}
    for i, s in at_format:
        changed, rate, reference = _changed(settings, s), measured.get(i), base[s["precision"]]
        if len(changed) == 1 and rate and reference and rate >= (1 + FASTER_BY) * reference:
            helpful.setdefault(s["precision"], set()).update(changed)
    return [
        i
        for i, s in at_format
        if len(helpful.get(s["precision"], ())) > 1
        and _changed(settings, s) == helpful[s["precision"]]
    ]
