"""The probe's choice against the baseline's own systems setting, in windows paired under the same
load: what a busy machine cannot fool.

A setting measured alone at one moment and another at the next compare the load of two moments as
much as the settings (one setting's end-to-end figures at five micro-batches read 56, 102, 5,229,
402 and 412 samples a second on two loaded cores). So the chosen setting and the baseline's are
measured end to end, one right after the other, ROUNDS times, alternating which goes first; each
round's ratio of their speeds is a comparison under one load. The chosen setting is kept only where
the ratios agree (their largest over their smallest at most AGREE) and their median beats the
baseline by more than that spread; where they disagree the machine was too busy to tell, and where
they agree on no lead the baseline's setting is as good: either way the baseline's setting stays.

The probe chooses at one micro-batch and the trials train others; a setting that leads at the
largest can trail at the smallest, where a step's fixed costs (a cast, a layout change, a handover
from a worker) weigh most. So a choice kept at the probe's batch is paired with the baseline's
setting again at the smallest micro-batch a trial trains, where it must not be slower
(`no_slower`): shown slower beyond the windows' spread, or too busy to tell, the baseline's
setting stays.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from autotune.probe import throughput
from autotune.train.config import TrialConfig

ROUNDS = 3
AGREE = 1.3  # the paired ratios' largest over their smallest, beyond which load moved too much
CHOSEN, BASELINE = "chosen", "baseline"


def against_baseline(
    measured: Callable[..., Any],
    chosen: TrialConfig,
    baseline: TrialConfig,
    *,
    rule: Callable[[list[float], dict[str, list[float]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """ROUNDS paired end-to-end measurements of `chosen` and `baseline` (`measured(work, *args)`
    runs one where the study measures), judged by `rule` (`decide` unless given); the outcome as
    plain JSON values: `ratios` (chosen over baseline, a round each), `spread`, `kept` (CHOSEN or
    BASELINE) and `why`."""
    ratios: list[float] = []
    speeds: dict[str, list[float]] = {CHOSEN: [], BASELINE: []}
    for round_ in range(ROUNDS):
        order = (BASELINE, CHOSEN) if round_ % 2 == 0 else (CHOSEN, BASELINE)
        configs = {key: chosen if key == CHOSEN else baseline for key in order}
        ends = measured(throughput.measure_briefly, configs)
        mine, base = ends[CHOSEN].samples_per_second, ends[BASELINE].samples_per_second
        if not mine or not base:  # out of memory, or no figure: nothing to pair
            why = "it ran out of memory beside the baseline's" if not mine else None
            return _outcome(ratios, speeds, kept=BASELINE if not mine else CHOSEN, why=why)
        speeds[CHOSEN].append(mine)
        speeds[BASELINE].append(base)
        ratios.append(mine / base)
    return (rule or decide)(ratios, speeds)


def unchecked(why: str) -> dict[str, Any]:
    """The outcome where no paired window ran (`why`): the baseline's setting stays."""
    return _outcome([], {CHOSEN: [], BASELINE: []}, kept=BASELINE, why=why)


def not_weighed(why: str) -> dict[str, Any]:
    """The outcome where the windows could not run for a reason neither setting owns (`why`: the
    task fails at that batch whatever its setting): the choice stands."""
    return _outcome([], {CHOSEN: [], BASELINE: []}, kept=CHOSEN, why=why)


def decide(ratios: list[float], speeds: dict[str, list[float]]) -> dict[str, Any]:
    """Keep the chosen setting where the paired ratios agree and beat the baseline beyond their
    spread; else the baseline's, saying why."""
    return _judged(ratios, speeds, lambda lead, spread: lead > spread, "no faster than")


def no_slower(ratios: list[float], speeds: dict[str, list[float]]) -> dict[str, Any]:
    """Keep the chosen setting unless the paired ratios show it slower than the baseline's beyond
    their spread, or disagree too much to tell: the rule at a trial's micro-batch, where the choice
    was already shown faster at the probe's."""
    return _judged(ratios, speeds, lambda lead, spread: lead * spread >= 1, "slower than")


def _judged(
    ratios: list[float],
    speeds: dict[str, list[float]],
    stands: Callable[[float, float], bool],
    otherwise: str,
) -> dict[str, Any]:
    """The baseline's setting where the ratios disagree beyond AGREE, or where their median lead
    and spread fail `stands` (said as `otherwise` the baseline's); else the chosen setting."""
    spread = max(ratios) / min(ratios)
    lead = statistics.median(ratios)
    if spread > AGREE:
        why = f"too busy to tell: paired windows disagreed by {spread:.2f}x"
        return _outcome(ratios, speeds, kept=BASELINE, why=why)
    if not stands(lead, spread):
        why = (
            f"{otherwise} the baseline's beyond the windows' spread ({lead:.2f}x, "
            f"spread {spread:.2f}x)"
        )
        return _outcome(ratios, speeds, kept=BASELINE, why=why)
    return _outcome(ratios, speeds, kept=CHOSEN, why=None)


def _outcome(
    ratios: list[float], speeds: dict[str, list[float]], *, kept: str, why: str | None
) -> dict[str, Any]:
    spread = max(ratios) / min(ratios) if ratios else None
    return {
        "ratios": ratios,
        "spread": spread,
        "kept": kept,
        "why": why,
        # the median of each side's windows: what the setting kept is timed by
        "speed": {k: statistics.median(v) if v else None for k, v in speeds.items()},
    }
