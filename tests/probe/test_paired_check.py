"""The probe's choice against the baseline's setting in paired windows: load that swings between
windows moves both sides of a round alike, and rounds that disagree keep the baseline's setting."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from autotune.probe import cap, paired_check, throughput
from autotune.probe.throughput import Throughput


def measured_under(loads: Iterator[float], chosen: float, baseline: float):
    """A `measured` that times each setting at its speed divided by the machine's load at that
    moment (one value of `loads` per measurement), as a loaded core slows whatever runs on it."""
    calls: list[list[str]] = []

    def measured(work, configs):
        assert work is throughput.measure_briefly
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


class _Clock:
    """time.monotonic for the probe, which jumps `ahead` seconds once told to."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead

    def time(self) -> float:
        return time.time()


class _Study:
    """Where a probe's measurements are kept as they end (what memo.Memo reads and writes of an
    Optuna study)."""

    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


def test_a_probe_past_its_time_cap_keeps_what_it_measured_and_the_baseline_s_setting_for_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cap stops the probe before its next measurement. Past it before the choice is shown
    beside the baseline's setting in paired windows, the baseline's setting is kept; after, the
    choice stands, unmeasured at the trials' other micro-batches. The report says which."""
    from autotune.probe import run
    from autotune.probe.memo import Memo
    from autotune.probe.model.outcome import restrict
    from autotune.probe.model.text import describe
    from autotune.spec import study_file
    from autotune.study import preparation
    from tests.probe.test_roofline import REPO, write_study

    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports
    monkeypatch.setenv(cap.PROBE_SECONDS_ENV, "600")  # reached only as the clock jumps
    path = write_study(tmp_path, probe="joint")
    raw = yaml.safe_load(path.read_text())
    # fewer settings to measure before the cap: two worker counts still leave a choice faster
    # than the baseline's setting (0 workers, fp32) to set beside it in paired windows
    raw["space"].update(num_workers=[0, 2])
    path.write_text(yaml.safe_dump(raw))
    spec = study_file.load(path)
    prepared = preparation.prepare(spec)
    last = {"end_to_end": throughput.measure_in_turn, "paired": throughput.measure_briefly}
    # Both probes measure alike up to the end-to-end check: the second goes on from the
    # measurements the first kept (as a probe cut short does: memo.py), and measures from its
    # first paired round on.
    kept = _Study()

    def probe(jump_after: str) -> tuple[dict, list[int]]:
        clock = _Clock()
        monkeypatch.setattr(run, "time", clock)
        paired_rounds = []

        def measure(work, *args, **where):
            result = prepared.measure(work, *args, **where)
            paired_rounds.extend([1] if work is throughput.measure_briefly else [])
            if work is last[jump_after]:
                clock.ahead = 1e6  # the cap has passed
            return result

        measuring = dataclasses.replace(prepared, measure=measure)
        return run.run(spec, measuring, Memo(kept)), paired_rounds

    # past the cap after the end-to-end check: the choice never checked beside the baseline's
    outcome, paired_rounds = probe("end_to_end")
    assert outcome["capped"]["seconds"] == 600
    said = describe(outcome)
    baseline_loader = {"num_workers": 0, "precision": "fp32"}
    assert outcome["capped"]["phase"] == "paired" and not paired_rounds
    assert outcome["paired"]["kept"] == "baseline"
    assert {k: outcome["chosen"][k] for k in baseline_loader} == baseline_loader
    assert outcome["precisions"] == ["fp32"]
    assert "before its paired measurements: the baseline's setting kept" in said
    space = restrict(prepared.space, outcome)
    assert space["num_workers"].values == (0,) and space["precision"].values == ("fp32",)
    assert outcome["batches"] == []  # nothing measured past the cap

    # past it after one paired round: shown faster in one round only, while three are the rule,
    # so the baseline's setting stays
    outcome, paired_rounds = probe("paired")
    assert outcome["kept_measurements"] >= 3  # compute, loaders, end to end: the first probe's
    assert outcome["capped"]["seconds"] == 600
    assert outcome["capped"]["phase"] == "paired" and len(paired_rounds) == 1
    assert outcome["paired"]["kept"] == "baseline"
    assert outcome["batches"] == []


def test_the_cap_is_a_share_of_the_budget_and_a_bad_setting_of_it_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.errors import AutotuneError
    from autotune.spec import study_file

    monkeypatch.delenv(cap.PROBE_SECONDS_ENV)
    readme = study_file.load(Path(__file__).resolve().parents[2] / "studies" / "digits.yaml")
    assert cap.probe_cap(readme) == 60  # a quarter of 20 trials of 12 s
    timed = dataclasses.replace(readme, budget=dataclasses.replace(readme.budget, timeout=100))
    assert cap.probe_cap(timed) == 25
    tiny = dataclasses.replace(readme, budget=dataclasses.replace(readme.budget, trials=1))
    assert cap.probe_cap(tiny) == 30  # the least it is given
    large = dataclasses.replace(readme, budget=dataclasses.replace(readme.budget, trials=1000))
    assert cap.probe_cap(large) == 120  # the most
    monkeypatch.setenv(cap.PROBE_SECONDS_ENV, "45")
    assert cap.probe_cap(readme) == 45
    for bad in ("0", "-3", "soon", "inf", "nan"):
        monkeypatch.setenv(cap.PROBE_SECONDS_ENV, bad)
        with pytest.raises(AutotuneError, match="AUTOTUNE_PROBE_SECONDS: got"):
            cap.probe_cap(readme)
