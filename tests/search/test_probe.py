"""The systems probe: loader knobs and precision settled by short runs before the search."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.search import probe
from autotune.search.space import Choices, Space
from autotune.spec.study_file import from_mapping

BASELINE = {
    "lr": 0.01,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "num_workers": 0,
    "prefetch_factor": None,
    "pin_memory": False,
    "precision": "fp32",
}


def space(**domains) -> Space:
    raw = {
        "data_on_device": False,
        "num_workers": [0, 1],
        "prefetch_factor": [2, 4],
        "pin_memory": False,
        "precision": ["fp32", "bf16"],
        **domains,
    }
    return from_mapping(
        {"task": "digits", "target": {"metric": "accuracy", "value": 0.9}, "space": raw},
        path=Path("probe.yaml"),
    ).space


def timed(seconds_of) -> tuple[list[dict], probe.RunProbe]:
    calls: list[dict] = []

    def measure(config: dict) -> float:
        calls.append(dict(config))
        return seconds_of(config)

    return calls, measure


def test_the_fastest_loader_setting_is_fixed_and_a_slower_narrow_precision_removed() -> None:
    # one worker with prefetch 4 is fastest; bf16 is 10% slower than fp32 (as on many CPUs)
    calls, measure = timed(
        lambda c: (
            (1.0 if c["num_workers"] == 0 else 0.8 - 0.1 * (c["prefetch_factor"] == 4))
            * (1.1 if c["precision"] == "bf16" else 1.0)
        )
    )
    outcome = probe.run(measure, space(), BASELINE)
    assert outcome["loader"] == {
        "data_on_device": False,
        "num_workers": 1,
        "prefetch_factor": 4,
        "pin_memory": False,
    }
    assert outcome["precisions"] == ["fp32"] and outcome["speed"]["bf16"] == pytest.approx(1 / 1.1)
    settings = [(c["num_workers"], c["prefetch_factor"], c["precision"]) for c in calls]
    loaders = [(0, None, "fp32"), (1, 2, "fp32"), (1, 4, "fp32")]
    # interleaved
    assert settings == loaders * probe.ROUNDS + [(1, 4, "fp32"), (1, 4, "bf16")] * probe.ROUNDS
    assert all(c["lr"] == 0.01 and c["batch_size"] == 32 for c in calls)  # the baseline's maths
    assert outcome["seconds"] == pytest.approx(sum(r["seconds"] for r in outcome["runs"]))

    restricted = probe.restrict(space(), outcome)
    assert restricted["num_workers"] == Choices((1,)) and restricted["prefetch_factor"] == Choices(
        (4,)
    )
    assert restricted["precision"] == Choices(("fp32",)) and restricted["lr"] == space()["lr"]
    line = probe.describe(outcome)
    assert (
        "num_workers 1, prefetch_factor 4" in line
        and "bf16 removed (0.91x the speed of fp32)" in line
    )
    assert "busy" not in line  # no load recorded (a study from before it was measured)
    assert "busy" not in probe.describe({**outcome, "other_cores": 0.1, "cores": 2})  # quiet
    assert "other processes kept 1.0 of 2 cores busy meanwhile" in probe.describe(
        {**outcome, "other_cores": 1.0, "cores": 2}
    )


def test_the_training_set_on_the_device_is_one_more_loader_setting_and_fixed_when_fastest() -> None:
    """Measured like the others (no workers, nothing to prefetch or pin); chosen, the space keeps
    it alone and its loader knobs at the values a setting without a DataLoader has."""
    calls, measure = timed(lambda c: 0.5 if c["data_on_device"] else 1.0)
    outcome = probe.run(measure, space(data_on_device=[False, True]), BASELINE)
    assert outcome["loader"] == {
        "data_on_device": True,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    # a loader among loaders, then each precision at it
    assert sum(c["data_on_device"] for c in calls) == probe.ROUNDS + 2 * probe.ROUNDS
    restricted = probe.restrict(space(data_on_device=[False, True]), outcome)
    assert restricted["data_on_device"] == Choices((True,))
    assert restricted["num_workers"] == Choices((0,))
    assert probe.describe(outcome).startswith("Systems probe (")
    assert "data on the device" in probe.describe(outcome)


def test_a_loader_setting_only_slightly_faster_than_a_simpler_one_is_not_taken() -> None:
    # two workers are 3% faster than none: within the noise, so no workers (the simplest)
    _, measure = timed(lambda c: 0.97 if c["num_workers"] == 2 else 1.0)
    outcome = probe.run(
        measure, space(num_workers=[0, 2], prefetch_factor=2, precision="fp32"), BASELINE
    )
    assert outcome["loader"] == {
        "data_on_device": False,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    _, measure = timed(lambda c: 0.9 if c["num_workers"] == 2 else 1.0)  # 10%: taken
    assert (
        probe.run(
            measure, space(num_workers=[0, 2], prefetch_factor=2, precision="fp32"), BASELINE
        )["loader"]["num_workers"]
        == 2
    )


def test_a_narrow_precision_stays_only_when_clearly_faster_and_runs_are_counted_by_their_best() -> (
    None
):
    noisy = iter([1.0, 3.0, 1.0, 0.7] * 10)  # fp32, bf16 in round 1 (bf16 disturbed), then again
    _, measure = timed(lambda c: next(noisy))
    outcome = probe.run(measure, space(num_workers=0), BASELINE)
    assert not outcome["probed_loader"] and outcome["precisions"] == ["fp32", "bf16"]
    assert outcome["speed"]["bf16"] == pytest.approx(1 / 0.7)
    # 2%: noise, not worth the risk
    _, measure = timed(lambda c: 0.98 if c["precision"] == "bf16" else 1.0)
    assert probe.run(measure, space(num_workers=0), BASELINE)["precisions"] == ["fp32"]


def test_settings_that_fail_settle_nothing() -> None:
    _, measure = timed(lambda c: float("inf"))  # the baseline's batch runs out of memory everywhere
    outcome = probe.run(measure, space(), BASELINE)
    assert outcome["loader"] == {
        "data_on_device": False,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    assert outcome["precisions"] == ["fp32", "bf16"]


def test_what_is_worth_probing() -> None:
    assert probe.worth_probing(space())
    assert not probe.worth_probing(space(num_workers=0, precision="fp32"))
    assert len(
        probe.loader_settings(space(num_workers={"low": 0, "high": 2}, pin_memory=[False, True]))
    ) == 2 * (1 + 2 + 2)
    assert not probe.worth_probing(
        space(num_workers={"low": 0, "high": 16}, prefetch_factor=[2, 4, 8], precision="fp32")
    )


def test_the_probe_runs_at_the_largest_batch_that_gives_enough_steps() -> None:
    """A GPU at the baseline's 32 samples waits on launches, not on data: the loader and the
    precisions are judged at the largest micro-batch with MIN_STEPS steps in a probe run."""
    calls, measure = timed(lambda c: 1.0)
    wide = space(batch_size=[16, 32, 128, 512])
    outcome = probe.run(measure, wide, BASELINE, samples=128 * probe.MIN_STEPS)
    assert outcome["batch_size"] == 128 and {c["batch_size"] for c in calls} == {128}
    assert "short runs at batch 128" in probe.describe(outcome)
    assert probe.probe_batch(wide, BASELINE, samples=None) == 32  # unknown window: the baseline's
    # never below the baseline's
    assert probe.probe_batch(wide, BASELINE, samples=10 * probe.MIN_STEPS) == 32


def test_a_large_batch_that_fails_falls_back_to_the_baselines() -> None:
    """Out of memory at the large batch (measured as never finishing): the probe goes on at the
    baseline's."""
    calls, measure = timed(
        lambda c: float("inf") if c["batch_size"] > 32 else (0.5 if c["num_workers"] else 1.0)
    )
    outcome = probe.run(
        measure, space(batch_size=[32, 512]), BASELINE, samples=512 * probe.MIN_STEPS
    )
    assert outcome["batch_size"] == 32 and calls[0]["batch_size"] == 512
    assert {c["batch_size"] for c in calls[1:]} == {32} and outcome["loader"]["num_workers"] == 1
    assert outcome["seconds"] < float("inf")
