"""Beginning a run, by the one process that holds a local file's lock, before any worker starts:
store the study's definition, recover what a killed run left, measure the systems (the probe, and
from it a goodput study's table) where the study has not yet, settle the run's plan, and queue a
new study's first trials.
"""

from __future__ import annotations

import contextlib
from typing import Any

import optuna

from autotune import progress
from autotune.probe import run
from autotune.probe.memo import Memo
from autotune.probe.model.outcome import describe, worth_probing
from autotune.probe.plan import chosen_systems
from autotune.record import definition, schema
from autotune.search import prior
from autotune.search.replay import sampled_values
from autotune.search.space import KNOBS, Space
from autotune.spec.storage_url import local_path
from autotune.spec.study_file import SYSTEMS_ONLY, StudySpec
from autotune.storage import opening, recovery
from autotune.study import goodput_table, probe_claim, run_plan
from autotune.study.preparation import Prepared
from autotune.study.run_plan import RunPlan
from autotune.study.sampler import startup_trials
from autotune.train.tasks import reference


def begin(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> RunPlan:
    """The run's plan, with the study's definition stored and its systems measured.

    A RUNNING trial of a local file belongs to a process that no longer runs (this one holds the
    lock). On a database server other machines' trials may be running; Optuna's heartbeat finds
    the dead ones instead.
    """
    schema.begin_study(
        study,
        target=spec.target.as_record(),
        optimizer=reference(prepared.task.optimizer) if prepared.task is not None else None,
        knobs=prepared.knobs if prepared.knobs != tuple(KNOBS) else None,
    )
    schema.record_definition(study, prepared.definition, changes=definition.changes)
    local = local_path(spec.storage) is not None
    if local:
        _recover(study)
    try:
        due = _probe_due(spec, prepared, study)
        while due and not local:  # another machine may be measuring them: wait for its figures
            probe_claim.wait_for_another(study)
            due = _probe_due(spec, prepared, study)
            if not due or probe_claim.claim(study):
                break
        with probe_claim.marked(study) if due and not local else contextlib.nullcontext():
            stored, probed = _measure_systems(spec, prepared, study)
    finally:
        if prepared.end_measuring is not None:  # the trials start with its memory back
            prepared.end_measuring()
    plan = run_plan.planned(spec, probed, study, stored)
    if (
        spec.first_trial != "sampled"
        and not study.get_trials(deepcopy=False)
        and spec.objective != SYSTEMS_ONLY
    ):
        _enqueue_first(spec, plan, study)
    return plan


def _measure_systems(
    spec: StudySpec, prepared: Prepared, study: optuna.Study
) -> tuple[dict[str, Any] | None, Prepared]:
    """The stored probe (measured here where it is due) and `prepared` as it settles the space,
    with the table a goodput study's trials are timed by stored from it."""
    if _probe_due(spec, prepared, study):
        memo = Memo(study)  # what a run cut short measured of it
        outcome = run.run(spec, prepared, memo)
        if schema.probe(study.user_attrs) is None:
            schema.record_probe(study, outcome)
            progress.tell(f"autotune: {describe(outcome)}")  # the report repeats it
        else:  # a run on another machine stored one while this one measured
            progress.say(opening.FIRST_STORED.format(what="systems probe"))
    stored = schema.probe(study.user_attrs)  # as every later run reads it
    probed = run_plan.with_probe(spec, prepared, stored)
    goodput_table.ensure_table(spec, prepared, study)
    return stored, probed


def _recover(study: optuna.Study) -> None:
    """Mark what a killed run left RUNNING interrupted, and queue those that chose a
    configuration."""
    interrupted = recovery.mark_running_interrupted(
        study, reason="the process stopped during this trial"
    )
    queued = set(recovery.queue_retries(study))
    for number in interrupted:
        progress.say(
            f"autotune: trial {number} was interrupted; it is marked failed and "
            + (
                "will run again"
                if number in queued
                else "a new trial takes its place (it stopped before its configuration was chosen)"
            )
        )


def _probe_due(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> bool:
    """Whether the probe runs: a study that has none stored, whose task autotune trains on one
    device, with a choice of settings to make or a goodput table to time."""
    return (
        spec.probe != "none"
        and schema.probe(study.user_attrs) is None
        and prepared.measure is not None
        and (worth_probing(prepared.space) or goodput_table.due(spec, study))
    )


def _enqueue_first(spec: StudySpec, plan: RunPlan, study: optuna.Study) -> None:
    if spec.first_trial == "prior":
        enqueue_prior(study, plan.space, plan.prepared, trials=spec.budget.trials)
        return
    # Under goodput the plan chooses the systems knobs: the baseline's maths is the first trial.
    baseline = plan.prepared.baseline
    if plan.goodput is not None:
        baseline = {**baseline, **chosen_systems(plan.space)}
    enqueue_baseline(study, plan.space, baseline)


def enqueue_baseline(study: optuna.Study, space: Space, baseline: dict[str, Any]) -> None:
    """Make the baseline a new study's first trial: the incumbent then starts at a known time and
    the search explores around it. A baseline outside the space (as the probe left it) cannot be
    a trial of it; the confirmation still measures it."""
    values = sampled_values(space, baseline)
    if values is None:
        progress.say(
            "autotune: the baseline lies outside the search space, so the first trial is sampled; "
            "the confirmation still measures the baseline"
        )
        return
    study.enqueue_trial(values, user_attrs=schema.queue_mark(schema.BASELINE), skip_if_exists=True)


def enqueue_prior(study: optuna.Study, space: Space, prepared: Prepared, *, trials: int) -> None:
    """Make a new study's first trials the prior's (prior.py), marked as such. At most as
    many as TPE's random start-up trials: they take those trials' place, not its model's."""
    count = min(len(prior.LR_FACTORS), trials, startup_trials(trials))
    for params in prior.first_trials(
        space, prepared.baseline, train_samples=prepared.train_samples, count=count
    ):
        # a run beginning the same study on another machine may have queued them a moment ago
        study.enqueue_trial(params, user_attrs=schema.queue_mark(schema.PRIOR), skip_if_exists=True)
