"""The probe's choice against the baseline's setting in paired windows: load that swings between
windows moves both sides of a round alike, and rounds that disagree keep the baseline's setting."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from autotune.study import paired_check
from autotune.train import throughput
from autotune.train.throughput import Throughput


def measured_under(loads: Iterator[float], chosen: float, baseline: float):
    """A `measured` that times each setting at its speed divided by the machine's load at that
    moment (one value of `loads` per measurement), as a loaded core slows whatever runs on it."""
    calls: list[list[str]] = []

    def measured(work, configs):
        assert work is throughput.measure_in_turn
        calls.append(list(configs))
        speeds = {paired_check.CHOSEN: chosen, paired_check.BASELINE: baseline}
        return {key: Throughput(speeds[key] / next(loads), 0.01, 5, 0.1) for key in configs}

    return measured, calls


def test_load_that_swings_between_rounds_hits_both_sides_of_a_round_and_the_lead_shows() -> None:
    """Load 1x, 50x, 3x, ...: alone, one window reads 50 times another; paired, each round's ratio
    is the settings' 2x."""
    loads = iter([1, 1, 50, 50, 3, 3])
    measured, calls = measured_under(loads, chosen=2000.0, baseline=1000.0)
    outcome = paired_check.against_baseline(measured, object(), object())
    assert outcome["ratios"] == pytest.approx([2.0, 2.0, 2.0]) and outcome["kept"] == "chosen"
    # each round measures both, alternating which goes first
    assert calls == [["baseline", "chosen"], ["chosen", "baseline"], ["baseline", "chosen"]]


def test_load_that_swings_within_a_round_is_too_busy_to_tell_and_keeps_the_baseline() -> None:
    loads = iter([1, 20, 20, 1, 1, 1])  # a spike on one side of each of two rounds
    measured, _ = measured_under(loads, chosen=1000.0, baseline=1000.0)
    outcome = paired_check.against_baseline(measured, object(), object())
    assert outcome["kept"] == "baseline" and outcome["why"].startswith("too busy to tell")


def test_a_lead_inside_the_windows_spread_keeps_the_baseline() -> None:
    outcome = paired_check.decide([1.05, 1.2, 0.97], {"chosen": [1.0], "baseline": [1.0]})
    assert outcome["kept"] == "baseline" and "beyond the windows' spread" in outcome["why"]
    outcome = paired_check.decide([1.5, 1.6, 1.45], {"chosen": [1.0], "baseline": [1.0]})
    assert outcome["kept"] == "chosen" and outcome["why"] is None


def test_a_choice_that_runs_out_of_memory_beside_the_baseline_is_not_kept() -> None:
    def measured(work, configs):
        return {
            "chosen": Throughput(None, None, 0, 0.0, oom=True),
            "baseline": Throughput(900.0, 0.01, 5, 0.1),
        }

    outcome = paired_check.against_baseline(measured, object(), object())
    assert outcome["kept"] == "baseline" and "out of memory" in outcome["why"]


def test_quiet_rounds_of_a_real_lead_agree_within_the_stated_spread() -> None:
    """The rule's AGREE against run-to-run noise of a few percent: ratios within it keep a real
    lead."""
    noise = itertools.cycle([1.0, 1.04, 0.97, 1.02, 0.99, 1.03])
    measured, _ = measured_under(noise, chosen=1300.0, baseline=1000.0)
    assert paired_check.against_baseline(measured, object(), object())["kept"] == "chosen"
