"""A trial's time and feasibility from its runs, under each objective
(autotune/study/objective.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.record import runs, seeds
from autotune.record.objectives import CUT_SHORT, of, outcome
from autotune.train.config import TrialResult


def run(
    *,
    seconds: float,
    reached_at: float | None = None,
    finals: tuple[float, ...] = (0.9,),
    stop: str = "max_epochs",
) -> TrialResult:
    """A run whose evaluations gave `finals`, the last at `seconds`."""
    curve = tuple((seconds * (i + 1) / len(finals), None, m) for i, m in enumerate(finals))
    return TrialResult(
        reached=reached_at is not None,
        time_to_target=reached_at,
        best_metric=max(finals),
        train_seconds=seconds,
        epochs=1.0,
        optimizer_steps=10,
        samples_per_second=None,
        peak_memory_bytes=None,
        device_name="cpu",
        torch_version="x",
        stop_reason=stop,
        curve=curve,
    )


def test_time_to_target_is_the_mean_crossing_when_every_run_reached() -> None:
    result = outcome(
        [
            run(seconds=2.0, reached_at=2.0, finals=(0.97,)),
            run(seconds=4.0, reached_at=4.0, finals=(0.98,)),
        ],
        of("time_to_target"),
        target=0.95,
    )
    assert result.value == pytest.approx(3.0)
    # judged by the worst run
    assert result.constraint == pytest.approx(0.95 - 0.97) and result.metric == 0.97


def test_time_to_target_is_infeasible_when_one_run_missed() -> None:
    result = outcome(
        [run(seconds=2.0, reached_at=2.0, finals=(0.97,)), run(seconds=6.0, finals=(0.94,))],
        of("time_to_target"),
        target=0.95,
    )
    # the training time both took
    assert result.constraint > 0 and result.value == pytest.approx(4.0)


def test_fixed_schedule_is_feasible_on_the_mean_final_metric_and_timed_by_the_whole_schedule() -> (
    None
):
    """One run ends under the target, the other over it: the mean decides; a better metric
    earlier in the run does not count."""
    runs = [run(seconds=3.0, finals=(0.99, 0.94)), run(seconds=5.0, finals=(0.90, 0.98))]
    result = outcome(runs, of("fixed_schedule"), target=0.95)
    assert result.value == pytest.approx(4.0)
    assert result.metric == pytest.approx(0.96) and result.constraint == pytest.approx(-0.01)
    assert outcome(runs, of("fixed_schedule"), target=0.97).constraint == pytest.approx(0.01)


def test_a_schedule_cut_short_by_the_time_limit_is_never_feasible() -> None:
    runs = [run(seconds=3.0, finals=(0.99,)), run(seconds=9.0, finals=(0.99,), stop="max_seconds")]
    assert outcome(runs, of("fixed_schedule"), target=0.95).constraint == CUT_SHORT > 0


def test_replicate_seeds_start_at_the_trials_own_and_never_repeat() -> None:
    assert seeds.replicates(100_007, 1) == [100_007]
    many = seeds.replicates(100_007, 5)
    assert many[0] == 100_007 and len(set(many)) == 5
    # no study's trial, probe or confirmation seed
    assert not any(0 <= s < 100_000 * 1000 for s in many[1:])


def test_an_empty_trial_and_an_unknown_objective_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one run"):
        outcome([], of("fixed_schedule"), target=0.9)
    with pytest.raises(ValueError, match="objective must be one of"):
        of("fastest")


def test_a_replicate_is_stored_with_its_seed_final_metric_and_samples_to_target() -> None:
    stored = runs.replicate(run(seconds=2.0, finals=(0.5, 0.7)), 42)
    assert stored == {
        "seed": 42,
        "train_seconds": 2.0,
        "time_to_target": None,
        "best_metric": 0.7,
        "final_metric": 0.7,
        "stop_reason": "max_epochs",
        "samples_to_target": None,
        "paused_seconds": None,
    }
    reached = dataclasses.replace(run(seconds=2.0, finals=(0.95,)), samples_to_target=640)
    assert runs.replicate(reached, 7)["samples_to_target"] == 640


def test_only_a_first_run_that_beats_the_best_gets_more_seeds_under_time_to_target() -> None:
    fast = run(seconds=1.0, reached_at=1.0, finals=(0.97,))
    slow = run(seconds=3.0, reached_at=3.0, finals=(0.97,))
    missed = run(seconds=3.0, finals=(0.5,))
    assert of("time_to_target").runs_for(fast, replicates=3, incumbent=2.0) == 3
    assert of("time_to_target").runs_for(fast, replicates=3, incumbent=None) == 3  # the first best
    assert of("time_to_target").runs_for(slow, replicates=3, incumbent=2.0) == 1
    assert of("time_to_target").runs_for(missed, replicates=3, incumbent=None) == 1
    # a mean needs them all
    assert of("fixed_schedule").runs_for(missed, replicates=3, incumbent=2.0) == 3
