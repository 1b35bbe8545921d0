"""A study's storage -> its Summary (record/summary.py), from stored results only."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from autotune.record import objectives, schema, verdict
from autotune.record.summary import (
    Baseline,
    Confirmation,
    Counts,
    StaleConfirmation,
    Summary,
    Winner,
)
from autotune.report import results, time_spent, winner
from autotune.search.knob import DDP_NAMES
from autotune.search.space import KNOBS, complete
from autotune.spec.command_task import CommandTask
from autotune.spec.sections import Target
from autotune.spec.storage_url import logs_folder
from autotune.spec.study_file import TIME_TO_TARGET


def summarize(
    name: str,
    records: pd.DataFrame,
    *,
    target: Mapping[str, Any],
    confirmation: Mapping[str, Any] | None,
    limits: Mapping[str, Any] | None = None,
    optimizer: str | None = None,
    device: str | None = None,
    probe_outcome: Mapping[str, Any] | None = None,
    objective: str = TIME_TO_TARGET,
    confusions: Mapping[int, Any] | None = None,
    throughput: Mapping[str, Any] | None = None,
    devices_per_trial: int = 1,
) -> Summary:
    """Counts, the winner (confirmed on fresh seeds where possible) and its speedup over the
    baseline.

    `records` are results.trial_records; `confirmation` is what the study stored of its last one.
    `confusions`: trial number -> the confusion matrix its run ended with (classification tasks),
    for the winner's per-class figures. Under the fixed_schedule `objective` a `time_to_target`
    is the time of the whole schedule, whose mean final metric reaches the target.
    """
    stale = _stale(records, confirmation)
    if stale is not None:
        confirmation = None  # it speaks for other trials than the study's best
    best = _best_trial(records, stale=stale is not None)
    baseline = speedup = confirmed = None
    if confirmation:
        confirmed, baseline, won, speedup = _confirmed(confirmation, records)
        best = won or best
    if best is not None:
        best = _with_detail(best, records, confirmation, confusions or {})
    summary = Summary(
        study=name,
        target=Target.from_record(target),
        counts=Counts(**results.counts(records)),
        objective=objective,
        best=best,
        baseline=baseline,
        speedup=speedup,
        confirmation=confirmed,
        limits=dict(limits) if limits else None,
        optimizer=optimizer,
        device=device,
        probe=dict(probe_outcome) if probe_outcome else None,
        stale_confirmation=stale,
        throughput=dict(throughput) if throughput else None,
        devices_per_trial=devices_per_trial,
    )
    # on one device DDP never ran: its knobs would only say so (results.knobs_shown)
    return _without(summary, DDP_NAMES) if devices_per_trial == 1 else summary


def _stale(
    records: pd.DataFrame, confirmation: Mapping[str, Any] | None
) -> StaleConfirmation | None:
    """The confirmation, when it was taken before faster trials came (the run that would redo it
    was stopped): then the best is reported as unconfirmed."""
    covered = confirmation.get("trials") if confirmation else None
    if (
        covered is None
        or [int(n) for n in results.best_feasible(records, count=len(covered))["number"]] == covered
    ):
        return None
    return StaleConfirmation(after_trials=confirmation["after_trials"], trials=tuple(covered))


def _best_trial(records: pd.DataFrame, *, stale: bool) -> Winner | None:
    """The study's fastest feasible trial, by its own runs."""
    best = results.best_feasible(records)
    if best.empty:
        return None
    row = best.iloc[0]
    number, runs = int(row["number"]), int(row["runs"])
    source = "single run" if runs == 1 else f"mean of {runs} runs"
    return Winner(
        trial=number,
        label=verdict.label(number),
        params=_params(row, results.param_names(records)),
        time_to_target=float(row["seconds"]),
        metric=float(row["objective_metric"]),
        runs=runs,
        source=source + (", not confirmed" if stale else ""),
        epochs=_plain(row["epochs"]),
    )


def _confirmed(
    confirmation: Mapping[str, Any], records: pd.DataFrame
) -> tuple[Confirmation, Baseline | None, Winner | None, float | None]:
    """The confirmation's figures, the baseline's, the configuration that won it (None when none
    reached the target) and its speedup over the baseline."""
    objective = confirmation.get("objective", TIME_TO_TARGET)
    minimize = confirmation.get("minimize", False)
    stats = verdict.stats(
        confirmation["runs"],
        objective=objective,
        target=confirmation.get("target"),
        minimize=minimize,
    )
    figures = Confirmation(
        seeds=tuple(confirmation["seeds"]),
        after_trials=confirmation["after_trials"],
        configs=stats,
        predicted=dict(confirmation.get("predicted", {})),
        baseline_resolved_by=confirmation.get("baseline_resolved_by"),
        precision_effect=confirmation.get("precision_effect"),
        kept_runs=confirmation.get("kept_measurements", 0),
        decision=verdict.decide(
            confirmation["runs"],
            objective=objective,
            target=confirmation.get("target"),
            seeds=len(confirmation["seeds"]),
            minimize=minimize,
        ),
        added_seeds=tuple(confirmation.get("added_seeds", ())),
    )
    baseline = _confirmed_baseline(confirmation, stats)
    label = figures.decision["winner"]
    if label not in stats:  # no baseline among the runs (a confirmation stored without one)
        return figures, baseline, None, None
    won = _confirmed_winner(confirmation, records, label, stats=stats, objective=objective)
    return figures, baseline, won, verdict.speedup(stats, label)


def _confirmed_baseline(
    confirmation: Mapping[str, Any], stats: Mapping[str, Mapping[str, Any]]
) -> Baseline | None:
    """The baseline's figures on the fresh seeds, and where its runs that missed stopped."""
    base = stats.get(verdict.BASELINE)
    if not base:
        return None
    missed = [
        r.get("stop_reason")
        for r in confirmation["runs"]
        if r["label"] == verdict.BASELINE and not r.get("reached")
    ]
    return Baseline(
        params=complete(confirmation["configs"][verdict.BASELINE]),
        time_to_target=base["median"],
        runs=base["runs"],
        reached=base["reached"],
        min=base["min"],
        max=base["max"],
        missed_at=tuple(sorted({reason for reason in missed if reason})),
    )


def _confirmed_winner(
    confirmation: Mapping[str, Any],
    records: pd.DataFrame,
    label: str,
    *,
    stats: Mapping[str, Mapping[str, Any]],
    objective: str,
) -> Winner:
    """The configuration `label` that won the confirmation, by its figures on the fresh seeds."""
    trial = {verdict.label(n): n for n in confirmation["trials"]}.get(label)  # None: the baseline
    metric = objectives.of(objective).metric
    metrics = [
        r[metric] for r in confirmation["runs"] if r["label"] == label and r.get(metric) is not None
    ]
    epochs = records.loc[records["number"] == trial, "epochs"]
    return Winner(
        trial=trial,
        label=label,
        params=complete(confirmation["configs"][label]),
        time_to_target=stats[label]["median"],
        metric=statistics.fmean(metrics)
        if metric == "final_metric"
        else statistics.median(metrics),
        runs=stats[label]["runs"],
        reached=stats[label]["reached"],
        min=stats[label]["min"],
        max=stats[label]["max"],
        source="confirmed",
        epochs=_plain(epochs.iloc[0]) if len(epochs) else None,  # of the study's own run of it
    )


def _with_detail(
    best: Winner,
    records: pd.DataFrame,
    confirmation: Mapping[str, Any] | None,
    confusions: Mapping[int, Any],
) -> Winner:
    """The winner with its hardware figures and per-class quality, from its confirmation runs
    where it was confirmed, else from its trial."""
    runs = (
        [r for r in confirmation["runs"] if r["label"] == best.label]
        if best.confirmed and confirmation
        else []
    )
    rows = records[records["number"] == best.trial]
    row = {k: _plain(v) for k, v in rows.iloc[0].items()} if len(rows) else None
    return dataclasses.replace(
        best,
        telemetry=winner.telemetry(runs, row),
        per_class=winner.pooled_per_class(runs, confusions.get(best.trial)),
        samples_to_target=winner.samples_to_target(runs, row),
    )


def of_study(spec: Any, study: Any) -> tuple[pd.DataFrame, Summary]:
    """Every trial of an Optuna study as a table, and the summary made from it, the study file's
    target and limits, and what the study stored (confirmation, optimizer, definition)."""
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    knobs = results.knobs_shown(attrs)
    records = results.trial_records(trials, knobs=knobs)
    b = spec.budget
    summary = summarize(
        spec.name,
        records,
        target=spec.target.as_record(),
        confirmation=schema.confirmation(attrs),
        limits={
            "max_epochs": b.max_epochs,
            "max_seconds": b.max_seconds,
            "eval_every": b.eval_every,
        },
        optimizer=schema.optimizer(attrs),
        device=schema.device(attrs),
        probe_outcome=schema.probe(attrs),
        objective=spec.objective,
        confusions={t.number: schema.measured(t).get("confusion") for t in trials},
        throughput=schema.throughput(attrs),
        devices_per_trial=schema.devices_per_trial(attrs),
    )
    summary = dataclasses.replace(
        summary,
        time_spent=time_spent.of_study(trials, attrs),
        measurements_kept=len(schema.probe_so_far(attrs)),
        trials_load=_trials_load(trials),
        logs=(
            str(logs_folder(spec.storage, spec.path, spec.name))
            if isinstance(spec.task, CommandTask)
            else None
        ),
    )
    if schema.knobs_read(attrs) is not None:
        summary = _show_only(summary, knobs)
    return records, summary


def _show_only(summary: Summary, knobs: Sequence[str]) -> Summary:
    """A study whose function reads only some knobs: its configurations show only those (and
    the parameters), and `knobs` tells exports not to invent the rest."""
    hidden = [k for k in KNOBS if k not in knobs]
    return dataclasses.replace(_without(summary, hidden), knobs=tuple(knobs))


def _without(summary: Summary, names: Sequence[str]) -> Summary:
    """The summary with the winner's and the baseline's configurations lacking `names`."""

    def shown(params: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if k not in names}

    best = (
        None
        if summary.best is None
        else dataclasses.replace(summary.best, params=shown(summary.best.params))
    )
    base = (
        None
        if summary.baseline is None
        else dataclasses.replace(summary.baseline, params=shown(summary.baseline.params))
    )
    return dataclasses.replace(summary, best=best, baseline=base)


def _params(row: pd.Series, extra: list[str]) -> dict[str, Any]:
    return complete({k: _plain(row.get(k)) for k in (*KNOBS, *extra)})


def _plain(value: Any) -> Any:
    """numpy scalars and NaN to plain Python values for JSON."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _trials_load(trials: Any) -> dict[str, Any] | None:
    """The other processes' load over the trials that measured it; None where none did."""
    loads = [schema.other_load(t) or {} for t in trials]
    cores = [load["other_cores"] for load in loads if load.get("other_cores") is not None]
    if not cores:
        return None
    return {
        "trials": len(cores),
        "median": statistics.median(cores),
        "min": min(cores),
        "max": max(cores),
        "cores": max(load.get("cores") or 0 for load in loads),
    }
