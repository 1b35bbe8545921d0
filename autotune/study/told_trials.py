"""Trials timed by a prediction rather than a clock: what a goodput trial's prediction is made of,
as it stores it, and under systems_only a trial for every other setting of the table, told from
the one that trained the baseline's maths (the settings leave the training unchanged, so the
samples it needed are theirs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from autotune.probe.model import goodput
from autotune.probe.plan import GoodputSettings
from autotune.record import runs, schema
from autotune.search.space import complete


def tell_settings(
    study: optuna.Study, plan: GoodputSettings, trained: optuna.trial.FrozenTrial
) -> int:
    """systems_only: a trial for every other measured setting of the baseline's maths, timed by
    the samples `trained` needed. Returns how many it added (none already told)."""
    result, predicted = schema.measured(trained), schema.prediction(trained)
    if predicted is None:
        return 0
    samples = predicted["samples_to_target"]
    told = [
        schema.trained_config(t)
        for t in study.get_trials(deepcopy=False)
        if t.number != trained.number
    ]
    config = schema.trained_config(trained)
    added = 0
    for knobs, speed in plan.table.options(config, plan.space):
        candidate = {**config, **knobs}
        if complete(candidate) in (config, *told):
            continue
        seconds = speed.seconds(samples)
        prediction = prediction_record(
            speed, samples=samples, seconds=seconds, trained=None, from_trial=trained.number
        )
        study.add_trial(
            optuna.trial.create_trial(
                value=seconds,
                constraints={"target": trained.constraints["target"]},
                user_attrs={
                    schema.TRAINED_CONFIG: candidate,
                    schema.RESULT: runs.predicted(
                        seconds=seconds,
                        samples=samples,
                        best_metric=result.get("best_metric"),
                        prediction=prediction,
                    ),
                },
            )
        )
        added += 1
    return added


def prediction_record(
    speed: goodput.Speed,
    *,
    samples: float,
    seconds: float,
    trained: Mapping[str, Any] | None,
    from_trial: int | None = None,
) -> dict[str, Any]:
    """What a predicted time is made of, as the trial stores it."""
    record = {
        "seconds": seconds,
        "samples_to_target": samples,
        "samples_per_second": speed.samples_per_second,
        "fixed_seconds": speed.fixed_seconds,
    }
    if trained is not None:
        record["trained"] = dict(trained)
    if from_trial is not None:
        record["from_trial"] = from_trial
    return record
