"""Which settings the probe measures end to end, which it need not, and which the measurements
choose (autotune/probe/model/decide.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from autotune.probe import throughput
from autotune.probe.model import decide, roofline, text
from tests.probe.test_roofline import compute, loader


def test_a_setting_outrun_over_every_run_even_at_twice_its_prediction_is_not_measured() -> None:
    """Measured at 3,000/s after 0.5 s, a setting beats one predicted at 1,000/s after 0.05 s
    over every run of 5,000-50,000 samples even were that one to run at twice its prediction
    (at 5,000: 2.17 s against 2.55 s); one predicted at 1,600/s might win the shortest runs at
    twice it (1.61 s), so it is measured."""
    fast, within = (3000.0, 0.5), (5_000, 50_000)
    assert decide.outrun_by((1000.0, 0.05), [fast], within=within) == fast
    assert decide.outrun_by((1600.0, 0.05), [fast], within=within) is None
    # times are linear in the samples: one measured setting must win at both ends; two that
    # share the range (one for short runs, one for long) do not rule out a third between them:
    # at 10,000 samples this one would take 4.35 s against their 6.67 s and 4.50 s
    short, long = (1500.0, 0.0), (4000.0, 2.0)
    assert decide.outrun_by((1300.0, 0.5), [short, long], within=(1_000, 40_000)) is None
    # a setting without a measured speed (out of memory) outruns nothing
    assert decide.outrun_by((1000.0, 0.05), [(None, 0.5)], within=within) is None


def test_measured_in_turn_each_setting_is_asked_whether_one_before_it_outruns_it() -> None:
    """The probe's end-to-end checks, in the order given: a setting that one measured before it
    outruns is skipped with the reason, and the ones after still asked."""
    timings = {"fast": (3000.0, 0.5), "slow": (1000.0, 0.05), "close": (2800.0, 0.5)}
    needless = decide.Outrun(timings, within=(5_000, 50_000))
    measured: list[str] = []

    class Session:
        def __init__(self, key: str) -> None:
            measured.append(key)
            self.key = key

        def window(self) -> float:
            return timings[self.key][0]

        def result(self, figures: list[float]) -> SimpleNamespace:
            return SimpleNamespace(samples_per_second=figures[0], reason=None)

        def close(self) -> None:
            pass

    results = throughput.in_turn(
        {key: (lambda key=key: Session(key)) for key in timings},
        out_of_memory=lambda why: SimpleNamespace(samples_per_second=None, reason=why),
        needless=needless,
        skipped=lambda why: SimpleNamespace(samples_per_second=None, reason=why),
        max_rounds=3,
    )
    assert measured == ["fast", "close"]
    assert results["slow"].samples_per_second is None
    assert results["slow"].reason == (
        "not measured: even at 2x its predicted 1,000 samples/s it would finish every "
        "run the study trains later than a setting measured at 3,000/s"
    )
    # a rule for what need not be measured needs the result to record instead
    with pytest.raises(TypeError):
        throughput.in_turn({}, out_of_memory=lambda why: why, needless=needless)
    assert results["close"].samples_per_second == 2800.0


def test_where_the_loader_holds_the_soonest_its_fastest_step_is_checked_too() -> None:
    """Steps that all outpace the loader are predicted alike, but end to end the one with the
    least CPU work may feed from the workers' cores fastest: it is measured as well."""
    held = [
        (roofline.Prediction(loader(4), compute(p), loader_rate=3000.0, compute_rate=rate), start)
        for p, rate, start in (("fp32", 3500.0, 0.1), ("fp16", 5000.0, 0.2), ("bf16", 6000.0, 0.3))
    ]
    checked = decide.to_check(held, samples=30_000, count=1, within=(1_000, 100_000))
    assert [p.compute["precision"] for p, _ in checked] == ["fp32", "bf16"]
    # a step that holds the setting is checked by its prediction alone
    bound = [(dataclasses.replace(p, loader_rate=9000.0), start) for p, start in held]
    checked = decide.to_check(bound, samples=30_000, count=1, within=(10_000, 100_000))
    assert [p.compute["precision"] for p, _ in checked] == ["bf16"]


def test_the_setting_chosen_is_the_soonest_over_the_run_it_is_chosen_for() -> None:
    """A faster rate pays only once a run is long enough to win back its later start: measured
    end to end at 4,000/s after 2 s, against 2,000/s after 0.2 s, it loses a run of 5,000 samples
    (3.25 s against 2.7 s) and wins one of 50,000 (14.5 s against 25.2 s)."""
    slow, fast = (
        roofline.Prediction(loader(w), compute("fp32"), loader_rate=rate, compute_rate=9000.0)
        for w, rate in ((2, 2000.0), (4, 4000.0))
    )
    checked = [(fast, 4000.0, 2.0), (slow, 2000.0, 0.2)]
    assert decide.decide(checked, samples=5_000) == (slow, 2000.0)
    assert decide.decide(checked, samples=50_000) == (fast, 4000.0)
    # the run chosen for lies between the first evaluation and the budget's end, on a log scale
    assert decide.run_length(1_000, 100_000) == pytest.approx(10_000)
    # a budget that ends before the first evaluation evaluates there: every run is that long
    assert decide.run_length(1_000, 500) == pytest.approx(500)


def test_the_report_counts_settings_outrun_apart_from_those_without_a_figure() -> None:
    chosen = roofline.Prediction(
        loader(4), compute("bf16"), loader_rate=5000.0, compute_rate=4000.0
    )
    entries = [
        {**chosen.figures(), "measured": 3900.0, "start_up": 0.1, "reason": None},
        {
            **roofline.Prediction(loader(0), compute("bf16"), 900.0, 4000.0).figures(),
            "measured": None,
            "start_up": 0.0,
            "reason": f"{decide.OUTRUN} even at 2x its predicted 734 samples/s ...",
        },
        {
            **roofline.Prediction(loader(4), compute("fp32"), 5000.0, 2000.0).figures(),
            "measured": None,
            "start_up": 0.1,
            "reason": "out of memory: CUDA out of memory",
        },
    ]
    outcome = {
        "batch_size": 128,
        "loader_rates": [],
        "compute_rates": [],
        "limit": chosen.figures(),
        "chosen": {**chosen.figures(), "measured": 3900.0},
        "checked": entries,
        "seconds": 5.0,
        "moves": "a larger batch",
    }
    head = text.describe(outcome).splitlines()[0]
    assert "1 end to end (1 more outrun before their turn, 1 without a figure)" in head
    outcome["checked"] = entries[:1]
    assert "1 end to end, 5.0 s" in text.describe(outcome).splitlines()[0]
