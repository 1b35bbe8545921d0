"""The ways to find a winner that benchmarks set side by side: a study as `autotune run` runs it,
and what a user writes instead, plain Optuna TPE over the same knobs in a hand-written loop; and
a process spinning on a core while either runs, for a shared machine."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import multiprocessing
import statistics
import time

import optuna

from autotune.record import schema, seeds, verdict
from autotune.report import summarize
from autotune.report.winner import predicted_seconds
from autotune.runners.isolation import TrialFailure
from autotune.search.space import suggest
from autotune.spec.study_file import StudySpec
from autotune.storage import opening
from autotune.study import preparation
from autotune.study.run import run_sequence
from autotune.train.config import TrialConfig

NONE_FOUND = "none found"  # the winner of a study in which no configuration reached the target


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(on: bool):
    """One process spinning on a core for as long as the block runs, when `on`: another job."""
    if not on:
        yield
        return
    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        spinner.kill()
        spinner.join()


def autotune_study(spec: StudySpec, prepared: preparation.Prepared, load_machine: bool) -> dict:
    """Run the study as `autotune run` would; its winner and what it spent."""
    started = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()), busy(load_machine):
        run_sequence(spec, prepared)
    tuning_wall = time.perf_counter() - started
    study = opening.open_study(spec, create=False)
    _, summary = summarize.of_study(spec, study)
    label, params = (
        (summary.best.label, summary.best.params)
        if summary.best
        else (NONE_FOUND, prepared.baseline)
    )
    # training seconds the trials spent: a pruned one up to where it was stopped
    compute = sum(schema.run_seconds(t)[0] for t in study.get_trials(deepcopy=False))
    phase = (schema.throughput(study.user_attrs) or {}).get("seconds", 0.0)
    probe = (summary.probe or {}).get("seconds")
    error = (
        summary.confirmation.prediction_error(label)
        if summary.confirmation and summary.best
        else None
    )
    return {
        "winner": label,
        "params": dict(params),
        "study_says": summary.speedup,
        "tuning_wall": tuning_wall,
        "trial_compute": compute,
        "probe_seconds": probe,
        "phase_seconds": phase,
        "compute": compute + phase + (probe or 0.0),
        "counts": dataclasses.asdict(summary.counts),
        "prediction_error": error,
        "trial_prediction_error": trial_prediction_error(study),
        "time_spent": summary.time_spent,  # by part: probe, trials, confirmation
    }


def trial_prediction_error(study: optuna.Study) -> float | None:
    """Goodput: the trained trials' median of (their runs' mean time to target / their predicted
    time - 1). The same runs and seeds on both sides, so this is the table's error alone."""
    errors = []
    for trial in study.get_trials(deepcopy=False):
        result, predicted = schema.measured(trial), schema.prediction(trial)
        if predicted is None or "trained" not in predicted:
            continue  # not a goodput trial, or one told from another's samples
        times = [r["time_to_target"] for r in result.get("replicates") or [result]]
        if all(t is not None for t in times):
            errors.append(statistics.fmean(times) / predicted["seconds"] - 1)
    return statistics.median(errors) if errors else None


def roofline_trials(study: optuna.Study) -> dict | None:
    """Under `probe: joint`, the trials that reached the target at a setting the probe measured
    (the one it chose, or another it checked end to end, where the trials moved once one had
    reached the target): each one's time to target over what its figures predicted for its samples
    (report.winner.predicted_seconds), their median and range; None where none did."""
    outcome = schema.probe(study.user_attrs)
    ratios = []
    for trial in study.get_trials(deepcopy=False):
        result, config = schema.measured(trial), schema.trained_config(trial)
        prediction = schema.prediction(trial)
        told = prediction is not None and "trained" not in prediction
        if config is None or not result.get("time_to_target") or told:
            continue  # told trials' times are predictions themselves (goodput, systems_only)
        predicted = predicted_seconds(outcome, config, result.get("samples_to_target"))
        if predicted:
            ratios.append(result["time_to_target"] / predicted)
    if not ratios:
        return None
    return {
        "trials": len(ratios),
        "median": statistics.median(ratios),
        "range": [min(ratios), max(ratios)],
    }


def plain_tpe_study(
    spec: StudySpec,
    prepared: preparation.Prepared,
    load_machine: bool,
    *,
    storage: str | optuna.storages.BaseStorage | None = None,
) -> dict:
    """What a user writes instead of autotune: Optuna's default TPE over the same knobs, one
    training run per trial, the study's trial budget; the fastest trial wins. With `storage`
    the trials are kept there and a later call goes on with them (a TPE seeded past the stored
    trials, so as not to replay their random start); no new trial starts after the spec's
    budget.timeout. `counts["trials"]`: the completed trials, every call's."""
    limits = preparation.limits_for(spec)

    def objective(trial: optuna.Trial) -> float:
        config = suggest(prepared.space, trial)
        try:
            result = prepared.run_trial(
                TrialConfig.from_mapping(config),
                limits=limits,
                device=prepared.device,
                seed=seeds.for_trial(spec.seed, trial.number),
            )
        except TrialFailure:
            return math.inf
        trial.set_user_attr("train_seconds", result.train_seconds)
        return result.time_to_target if result.reached else math.inf

    name = f"{spec.name}-plain-tpe"
    study = optuna.create_study(
        study_name=name, storage=storage, direction="minimize", load_if_exists=True
    )
    study.sampler = optuna.samplers.TPESampler(
        seed=seeds.for_sampler(spec.seed, stored_trials=len(study.trials), worker=None)
    )
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    started = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()), busy(load_machine):
        if done < spec.budget.trials:
            study.optimize(
                objective, n_trials=spec.budget.trials - done, timeout=spec.budget.timeout
            )
    tuning_wall = time.perf_counter() - started
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    reached = [t for t in complete if math.isfinite(t.value)]
    best = min(reached, key=lambda t: t.value) if reached else None
    params = (
        suggest(prepared.space, optuna.trial.FixedTrial(best.params)) if best else prepared.baseline
    )
    spent = sum(t.user_attrs.get("train_seconds", 0.0) for t in complete)
    return {
        "winner": verdict.label(best.number) if best else NONE_FOUND,
        "params": params,
        "study_says": None,
        "tuning_wall": tuning_wall,
        "trial_compute": spent,
        "probe_seconds": None,
        "phase_seconds": 0.0,
        "compute": spent,
        "counts": {"trials": len(complete), "reached": len(reached)},
        "prediction_error": None,
    }
