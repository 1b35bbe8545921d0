"""Where a study's time went (report/time_spent.py), from what its storage holds."""

from __future__ import annotations

import datetime

import optuna

from autotune.record import schema
from autotune.report import time_spent

START = datetime.datetime(2026, 1, 1, 12, 0, 0)


def trial(
    number: int, *, wall: float, training: float, paused: float | None = None
) -> optuna.trial.FrozenTrial:
    """A finished trial that took `wall` seconds, `training` of them on its training clock and
    `paused` off it (evaluating; None: not said, as a command's)."""
    return optuna.trial.FrozenTrial(
        number=number,
        state=optuna.trial.TrialState.COMPLETE,
        value=training,
        datetime_start=START,
        datetime_complete=START + datetime.timedelta(seconds=wall),
        params={},
        distributions={},
        user_attrs={schema.RESULT: {"train_seconds": training, "paused_seconds": paused}},
        system_attrs={},
        intermediate_values={},
        trial_id=number,
    )


def test_each_part_is_its_wall_time_and_the_trials_are_split_into_training_and_the_rest() -> None:
    attrs = {schema.PROBE: {"seconds": 70.0}, schema.CONFIRMATION: {"seconds": 80.0}}
    trials = [trial(0, wall=9.0, training=4.0), trial(1, wall=6.0, training=3.0)]
    waiting = optuna.trial.create_trial(state=optuna.trial.TrialState.WAITING)
    # killed, and marked at the next run's start a day later: its wall time says nothing
    killed = trial(2, wall=86_400.0, training=0.0)
    killed.state = optuna.trial.TrialState.FAIL
    killed.set_user_attr(schema.INTERRUPTED, True)
    spent = time_spent.of_study([*trials, waiting, killed], attrs)
    assert spent == {
        "probe": 70.0,
        "throughput_table": None,
        "trials": 15.0,
        "confirmation": 80.0,
        "trial_count": 2,
        "training": 7.0,
        "evaluating": None,
        "total": 165.0,
    }
    assert time_spent.describe(spent) == (
        "Time spent: 2.8 min in all: systems probe 1.2 min, 2 trials 0.2 min "
        "(training 0.1 min; evaluating, starting and storing 0.1 min), confirmation 1.3 min."
    )


def test_a_short_study_speaks_in_seconds_and_what_was_not_recorded_is_left_out() -> None:
    # a confirmation stored before its time was: no seconds
    spent = time_spent.of_study([trial(0, wall=2.5, training=1.0)], {schema.CONFIRMATION: {}})
    assert spent is not None and spent["confirmation"] is None and spent["total"] == 2.5
    assert time_spent.describe(spent) == (
        "Time spent: 2.5 s in all: 1 trial 2.5 s "
        "(training 1.0 s; evaluating, starting and storing 1.5 s)."
    )
    assert time_spent.of_study([], {}) is None


def test_the_trials_evaluations_are_told_apart_where_their_runs_said_pruned_ones_included() -> None:
    finished = trial(0, wall=9.0, training=4.0, paused=2.0)
    # pruned in its second run: the seconds on and off the clock over both runs until then
    pruned = trial(1, wall=8.0, training=0.0)
    pruned.state = optuna.trial.TrialState.PRUNED
    pruned.user_attrs = {schema.PRUNED_AT: 3.0, schema.PAUSED_AT: 1.5}
    # a command's: its evaluations ran on its own clock, counted as training
    command = trial(2, wall=3.0, training=2.5)
    spent = time_spent.of_study([finished, pruned, command], {})
    assert spent is not None
    assert (spent["trials"], spent["training"], spent["evaluating"]) == (20.0, 9.5, 3.5)
    assert time_spent.describe(spent) == (
        "Time spent: 20.0 s in all: 3 trials 20.0 s "
        "(training 9.5 s, evaluating 3.5 s; starting and storing 7.0 s)."
    )
    # a part that took a few milliseconds is not shown as none
    brief = {**spent, "evaluating": 0.02, "training": 19.0}
    assert "(training 19.0 s, evaluating under 0.1 s; starting and storing 1.0 s)" in (
        time_spent.describe(brief)
    )
    # a figure stored before evaluations were told apart reads as it did
    del spent["evaluating"]
    assert "(training 9.5 s; evaluating, starting and storing 10.5 s)" in time_spent.describe(spent)
