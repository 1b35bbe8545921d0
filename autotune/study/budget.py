"""The trial budget: which stored trials count against it, and the slots that workers take."""

from __future__ import annotations

from collections.abc import Iterable

import optuna
from optuna.trial import TrialState

from autotune.record import derived, schema
from autotune.spec.study_file import SYSTEMS_ONLY, StudySpec

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


# systems_only trains the baseline's maths once; a try that misses the target on its seeds (the
# maths is the user's own, so that is the seeds' luck) leaves nothing to tell the other settings
# from, so it trains again on new seeds, up to this many tries in all.
SYSTEMS_ONLY_TRIES = 3


def trials_to_train(spec: StudySpec, trials: Iterable[optuna.trial.FrozenTrial] = ()) -> int:
    """The trials the study trains: its budget's; under systems_only, the baseline's maths once
    (every other measured setting is told from it), once more after each finished try that missed
    the target (`trials`: the study's so far), up to SYSTEMS_ONLY_TRIES."""
    if spec.objective != SYSTEMS_ONLY:
        return spec.budget.trials
    missed = sum(1 for t in trials if counts_against_budget(t) and not derived.is_feasible(t))
    return min(SYSTEMS_ONLY_TRIES, 1 + missed)


def counts_against_budget(trial: optuna.trial.FrozenTrial) -> bool:
    """Every finished trial counts, except interrupted ones (their configuration runs again),
    surplus ones (asked for by a worker after others had taken the whole budget; never run) and
    those pruned unrun, known to run out of memory or with an effective batch larger than the
    training set (they cost nothing; `run_out_unrun` bounds them)."""
    return (
        trial.state in FINISHED
        and not schema.is_interrupted(trial)
        and not schema.is_surplus(trial)
        and not schema.is_unrun(trial)
    )


def run_out_unrun(trials: Iterable[optuna.trial.FrozenTrial], budget: int) -> bool:
    """Whether as many trials as the budget were pruned unrun: a space whose sampler draws little
    else ends there, rather than asking without end."""
    return sum(1 for t in trials if schema.is_unrun(t)) >= budget


def finished_count(trials: Iterable[optuna.trial.FrozenTrial]) -> int:
    """Trials (from one `study.get_trials(deepcopy=False)`) that count against the budget."""
    return sum(1 for t in trials if counts_against_budget(t))


def _holds_slot(trial: optuna.trial.FrozenTrial) -> bool:
    return trial.state in (TrialState.RUNNING, TrialState.WAITING) or counts_against_budget(trial)


def slots_taken(trials: Iterable[optuna.trial.FrozenTrial]) -> int:
    """Trials finished, running or queued that count against the budget."""
    return sum(1 for t in trials if _holds_slot(t))


def slots_before(
    study: optuna.Study, number: int, trials: Iterable[optuna.trial.FrozenTrial] | None = None
) -> int:
    """How many trials numbered before this one hold a slot of the budget.

    Workers each check the budget before they ask for a trial, so two of them can both take the
    last slot; the trial numbers order them, and the later one is surplus. Called after the
    trial's parameters are written, by when every earlier trial's creation has been committed.
    `trials`: a read that is known to be current (a process running alone); else the storage is
    read.
    """
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    return sum(1 for t in trials if t.number < number and _holds_slot(t))


def mark_surplus(study: optuna.Study, trial: optuna.trial.Trial) -> None:
    """End a trial that would overrun the budget, before it trains; reports leave it out."""
    schema.record_surplus(trial)
    study.tell(trial, state=TrialState.FAIL)
