"""Re-measure the best configurations and the baseline on fresh seeds, side by side and
interleaved, so that all see the same machine load; what the runs mean is record/verdict.py.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
import torch

from autotune import progress, signals
from autotune.probe.memo import Memo
from autotune.record import derived, runs, schema, seeds, verdict
from autotune.record.verdict import BASELINE, baseline_resolved
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.search.space import complete
from autotune.spec.study_file import FIXED_SCHEDULE, TIME_TO_TARGET, StudySpec
from autotune.study.budget import finished_count
from autotune.study.preparation import Prepared, limits_for
from autotune.train.config import Limits, TrialConfig


def run_candidates(
    run_trial: RunTrial,
    candidates: Mapping[str, Mapping[str, Any]],
    *,
    seeds: Sequence[int],
    limits: Limits,
    device: torch.device,
    on_run: Callable[[], None] | None = None,
    until_resolved: bool = False,
    memo: Memo | None = None,
    metric_name: str | None = None,
) -> list[dict[str, Any]]:
    """Run every candidate once per seed, interleaved, the baseline last; one record per run.
    With `until_resolved`, the baseline's runs stop once `baseline_resolved`: last, so that at its
    second turn every candidate has run twice, and its first run may be enough. `memo`: the runs
    an earlier run of this confirmation kept, and where to keep new ones. With `metric_name`,
    each run shows its steps and last metric as a trial's do.

    A run that fails (runs out of memory, hangs, crashes) counts as not reaching the target.
    """

    def one_run(
        _: str, label: str, config: Mapping[str, Any], limits: Limits, **where: Any
    ) -> dict:
        shown = _shown(f"confirming {label}, seed {where['seed']}", metric_name)
        try:
            result = run_trial(
                TrialConfig.from_mapping(config), limits=limits, progress=shown, **where
            )
        except TrialFailure as failure:
            return runs.failed_confirmation(failure.reason, label=label, seed=where["seed"])
        finally:
            if shown is not None:
                shown.close()
        return runs.confirmation_run(result, label=label, seed=where["seed"])

    memo = memo or Memo()
    records: list[dict[str, Any]] = []
    order = sorted(candidates.items(), key=lambda item: item[0] == BASELINE)  # stable
    for seed in seeds:
        for label, config in order:
            if label == BASELINE and until_resolved and baseline_resolved(records):
                continue
            where = {"device": device, "seed": seed}
            records.append(
                memo.measured(one_run, "confirmation run", label, config, limits, **where)
            )
            if on_run is not None:
                on_run()
    return records


class _Shown:
    """A confirmation run's progress, shown as a trial's is: its steps and last metric."""

    def __init__(self, desc: str, metric_name: str) -> None:
        self.metric_name = metric_name
        self.bar = progress.bar(
            desc, unit="step", leave=False, announce=False, every=progress.LINE_EVERY_SECONDS
        )

    def __call__(
        self, steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        signals.check()
        progress.show_run(self.bar, steps, total, metric, metric_name=self.metric_name)

    def close(self) -> None:
        self.bar.close()


def _shown(desc: str, metric_name: str | None) -> _Shown | None:
    return None if metric_name is None else _Shown(desc, metric_name)


def confirm_best(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> dict[str, Any] | None:
    """Re-run the best feasible configurations and the baseline on fresh seeds; store the outcome.

    Reused without training when the stored confirmation covers the same finished trials.
    """
    if spec.confirm.top == 0 or spec.confirm.runs == 0:
        return None
    trials = study.get_trials(deepcopy=False)
    top = sorted((t for t in trials if derived.is_feasible(t)), key=lambda t: (t.value, t.number))
    top = top[: spec.confirm.top]
    if not top:
        return None
    after = finished_count(trials)
    numbers = [t.number for t in top]
    stored = schema.confirmation(study.user_attrs)
    if _still_holds(spec, stored, after=after, numbers=numbers):
        return stored
    candidates, twin = _candidates(
        spec, prepared, {t.number: schema.trained_config(t) for t in top}
    )
    fresh_seeds = seeds.fresh(spec.seed, spec.confirm.runs)
    # Told apart by time to target only: a fixed schedule's runs all take about as long.
    until_resolved = spec.confirm.baseline == "until_resolved" and spec.objective != FIXED_SCHEDULE
    total = len(fresh_seeds) * len(candidates)
    started = time.monotonic()
    memo = Memo(study)  # the runs a confirmation cut short kept
    with progress.bar("confirming on fresh seeds", total=total, unit="run", leave=False) as bar:
        with signals.interruptible():
            run = functools.partial(
                run_candidates,
                prepared.run_trial,
                limits=limits_for(spec),
                device=prepared.device,
                on_run=lambda: (bar.update(1), signals.check()),
                memo=memo,
                metric_name=spec.target.metric,
            )
            records = run(candidates, seeds=fresh_seeds, until_resolved=until_resolved)
            added = _until_resolved(spec, run, candidates, records, bar)
    outcome = {
        "after_trials": after,
        "trials": numbers,
        "configs": candidates,
        "seeds": fresh_seeds,
        "added_seeds": added,
        "runs": records,
        "objective": spec.objective,
        "target": spec.target.value,
        **({"minimize": True} if spec.target.minimize else {}),
        "baseline_resolved_by": (
            verdict.resolved_by(sum(r["label"] == BASELINE for r in records))
            if until_resolved
            else None
        ),
        "precision_checked": spec.confirm.precision,
        # wall: its runs and their start-up, those a run cut short kept where they were spent
        "seconds": time.monotonic() - started + memo.recalled_seconds,
        **memo.counted(),
    }
    predicted = {
        verdict.label(t.number): t.value
        for t in top
        if schema.prediction(t) is not None and verdict.label(t.number) in candidates
    }
    if predicted:  # goodput: the search's predicted times, to set beside the measured ones
        outcome["predicted"] = predicted
    if twin is not None:
        fastest = verdict.label(numbers[0])
        precision = candidates[fastest]["precision"]
        outcome["precision_effect"] = verdict.precision_effect(records, fastest, precision)
    schema.record_confirmation(study, json.loads(json.dumps(outcome)))
    return outcome


def _until_resolved(
    spec: StudySpec,
    run: Callable[..., list[dict[str, Any]]],
    candidates: Mapping[str, Mapping[str, Any]],
    records: list[dict[str, Any]],
    bar: Any,
) -> list[int]:
    """confirm.runs: auto: one more fresh seed at a time for the leader and the baseline,
    interleaved, while the leader's lead is not resolved either way (verdict.decide), up to
    confirm.max_runs seeds; `records` grows by their runs. The seeds added."""
    added: list[int] = []
    first = spec.confirm.runs
    every = seeds.fresh(spec.seed, spec.confirm.max_runs or first)
    for seed in every[first:]:
        decision = verdict.decide(
            records,
            objective=spec.objective,
            target=spec.target.value,
            seeds=first,
            interval=False,
            minimize=spec.target.minimize,
        )
        labels = verdict.more_seeds_for(decision)
        if not labels:
            break
        bar.total += len(labels)
        records += run({label: candidates[label] for label in labels}, seeds=[seed])
        added.append(seed)
    return added


def _still_holds(
    spec: StudySpec, stored: Mapping[str, Any] | None, *, after: int, numbers: list[int]
) -> bool:
    """Whether the stored confirmation measured these trials, after as many, as the file asks."""
    return bool(
        stored
        and stored.get("after_trials") == after
        and stored.get("trials") == numbers
        and stored.get("objective", TIME_TO_TARGET) == spec.objective
        and stored.get("precision_checked", False) == spec.confirm.precision
    )


def _candidates(
    spec: StudySpec, prepared: Prepared, configs: Mapping[int, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], tuple[str, dict[str, Any]] | None]:
    """The baseline and the trials by label, and the fastest's fp32 twin where asked for. A trial
    that is the baseline (its first trial, or a sampled twin) is measured once, as the baseline."""
    baseline = complete(prepared.baseline)
    candidates = {verdict.BASELINE: prepared.baseline}
    candidates.update({verdict.label(n): c for n, c in configs.items() if c != baseline})
    fastest = verdict.label(next(iter(configs)))
    twin = (
        verdict.fp32_twin(fastest, candidates[fastest])
        if spec.confirm.precision and fastest in candidates
        else None
    )
    if twin is not None:
        candidates[twin[0]] = twin[1]
    return candidates, twin
