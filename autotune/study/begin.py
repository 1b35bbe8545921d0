"""Beginning a run, by the one process that holds a local file's lock, before any worker starts:
store the study's definition, recover what a killed run left, measure the systems (the probe,
the throughput phase) where the study has not yet, settle the run's plan, and queue a new
study's first trials.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import optuna

from autotune import progress, signals
from autotune.record import definition, schema, seeds
from autotune.runners import isolation
from autotune.search import prior, probe, roofline
from autotune.search.replay import sampled_values
from autotune.search.space import KNOBS, Space, complete
from autotune.spec.study_file import SYSTEMS_ONLY, StudySpec
from autotune.study import (
    probe_claim,
    probe_memo,
    recovery,
    roofline_probe,
    run_plan,
    storage,
    throughput_phase,
)
from autotune.study.preparation import Prepared
from autotune.study.run_plan import RunPlan
from autotune.study.sampler import startup_trials
from autotune.train import telemetry
from autotune.train.config import Limits, TrialConfig
from autotune.train.measure import other_load
from autotune.train.tasks import reference


def begin(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> RunPlan:
    """The run's plan, with the study's definition stored and its systems measured.

    A RUNNING trial of a local file belongs to a process that no longer runs (this one holds the
    lock). On a database server other machines' trials may be running; Optuna's heartbeat finds
    the dead ones instead.
    """
    schema.begin_study(
        study,
        target={"metric": spec.target.metric, "value": spec.target.value},
        optimizer=reference(prepared.task.optimizer) if prepared.task is not None else None,
        knobs=prepared.knobs if prepared.knobs != tuple(KNOBS) else None,
    )
    schema.record_definition(study, prepared.definition, changes=definition.changes)
    local = storage.local_path(spec.storage) is not None
    if local:
        _recover(study)
    try:
        due = _probe_due(spec, prepared, study) or throughput_phase.due(spec, study)
        while due and not local:  # another machine may be measuring them: wait for its figures
            probe_claim.wait_for_another(study)
            due = _probe_due(spec, prepared, study) or throughput_phase.due(spec, study)
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
    with the throughput phase's table stored where the objective needs one."""
    if _probe_due(spec, prepared, study):
        memo = probe_memo.Memo(study)  # what a run cut short measured of it
        outcome = (
            roofline_probe.run(spec, prepared, memo)
            if spec.probe == "joint"
            else run_probe(spec, prepared, memo)
        )
        if schema.probe(study.user_attrs) is None:
            schema.record_probe(study, outcome)
            progress.tell(f"autotune: {probe.describe(outcome)}")  # the report repeats it
        else:  # a run on another machine stored one while this one measured
            progress.say(storage.FIRST_STORED.format(what="systems probe"))
    stored = schema.probe(study.user_attrs)  # as every later run reads it
    probed = run_plan.with_probe(spec, prepared, stored)
    throughput_phase.ensure_phase(spec, prepared, study, probed.space)
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
    return (
        spec.probe != "none"
        and schema.probe(study.user_attrs) is None
        and prepared.task is not None
        and probe.worth_probing(prepared.space)
    )


def _enqueue_first(spec: StudySpec, plan: RunPlan, study: optuna.Study) -> None:
    if spec.first_trial == "prior":
        enqueue_prior(study, plan.space, plan.prepared, trials=spec.budget.trials)
        return
    # Under goodput the plan chooses the systems knobs: the baseline's maths is the first trial.
    baseline = plan.prepared.baseline
    if plan.goodput is not None:
        baseline = {**baseline, **throughput_phase.chosen_systems(plan.space)}
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
    """Make a new study's first trials the prior's (search/prior.py), marked as such. At most as
    many as TPE's random start-up trials: they take those trials' place, not its model's."""
    count = min(len(prior.LR_FACTORS), trials, startup_trials(trials))
    for params in prior.first_trials(
        space, prepared.baseline, train_samples=prepared.train_samples, count=count
    ):
        # a run beginning the same study on another machine may have queued them a moment ago
        study.enqueue_trial(params, user_attrs=schema.queue_mark(schema.PRIOR), skip_if_exists=True)


def run_probe(
    spec: StudySpec, prepared: Prepared, memo: probe_memo.Memo | None = None
) -> dict[str, Any]:
    """The systems probe (probe.py) with short runs of the study's task on a seed of its own.
    `memo`: the runs an earlier run of this probe kept, and where to keep new ones."""
    epochs = min(probe.PROBE_EPOCHS, spec.budget.max_epochs)
    limits = Limits(
        target=math.inf, max_epochs=epochs, max_seconds=spec.budget.max_seconds, eval_every=epochs
    )
    memo = memo or probe_memo.Memo()
    run_trial = prepared.probe_trial or prepared.run_trial
    peaks: list[int | None] = []  # each run's peak memory; None: it failed

    def short_run(_: str, config: dict[str, Any], limits: Limits, **where: Any) -> list:
        """[training seconds, peak memory] of one short run; [inf, None] where it failed."""
        try:
            result = run_trial(TrialConfig.from_mapping(complete(config)), limits=limits, **where)
        except isolation.TrialFailure:
            return [math.inf, None]
        return [result.train_seconds, result.peak_memory_bytes]

    def measure(config: dict[str, Any]) -> float:
        signals.check()
        where = {"device": prepared.device, "seed": seeds.for_probe(spec.seed)}
        seconds, peak = memo.measured(short_run, "systems probe run", config, limits, **where)
        peaks.append(peak)
        bar.update(1 if math.isfinite(seconds) else 0)
        return seconds

    with (
        progress.bar("systems probe", unit="run", leave=False) as bar,
        signals.interruptible(),
        other_load() as load,
    ):
        outcome = probe.run(
            measure,
            prepared.space,
            prepared.baseline,
            samples=int(epochs * len(prepared.task.train)),
        )
    # every run at most the probe's batch, any precision: the hungriest decides (roofline's rule)
    memory = roofline.checkpointing_fit(
        prepared.space,
        peaks,
        batch=outcome["batch_size"],
        device_bytes=telemetry.memory_bytes(prepared.device),
    )
    if memory is not None:
        outcome["checkpointing"] = memory
        outcome["fixed"] = {"checkpointing": False} if memory["fits"] else {}
    return {**outcome, **memo.counted(), **load.record()}
