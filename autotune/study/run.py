"""The run sequence, used by `autotune run`, `autotune.tune` and the benchmarks: begin the study
(storage, sampler, definition, the systems probe), run the trials, confirm the best.

Everything a trial records goes through the schema onto the Optuna trial, so reports are made
from the storage alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna

from autotune import progress, signals
from autotune.record import definition, objectives, schema, seeds, verdict
from autotune.runners import isolation
from autotune.search import prior, probe
from autotune.search.space import KNOBS, Space, complete, sampled_values
from autotune.spec.study_file import FIXED_SCHEDULE, SYSTEMS_ONLY, TIME_TO_TARGET, StudySpec
from autotune.study import (
    confirm,
    one_trial,
    roofline_probe,
    runner_lock,
    storage,
    throughput_phase,
)
from autotune.study.budget import finished_count, slots_taken, trials_to_train
from autotune.study.preparation import (
    Prepared,
    as_begun,
    check_unchanged,
    limits_for,
    print_notices,
)
from autotune.train.config import Limits, TrialConfig
from autotune.train.measure import other_load
from autotune.train.tasks import reference


def make_sampler(
    spec: StudySpec, *, stored_trials: int, worker: int | None
) -> optuna.samplers.BaseSampler:
    """autotune's sampler, seeded by the seed scheme (record/seeds.py)."""
    seed = seeds.sampler(spec.seed, stored_trials=stored_trials, worker=worker)
    return tpe_sampler(seed=seed, trials=spec.budget.trials)


def tpe_sampler(*, seed: int, trials: int) -> optuna.samplers.TPESampler:
    """TPE for a study of `trials` trials. Optuna 5's TPE is multivariate by default already
    (benchmarks/search.py finds it searches exactly like the default TPE on an all-categorical
    space): what it adds is `group`, for the conditional prefetch_factor, and fewer random
    start-up trials in short studies. autotune's gains come from pruning and the probe."""
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", optuna.exceptions.ExperimentalWarning
        )  # `group` is experimental
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup_trials(trials),
            multivariate=True,  # knobs interact (lr with batch size and schedule)
            group=True,  # prefetch_factor exists only with workers
        )


def startup_trials(trials: int) -> int:
    """The random trials TPE draws in a study of `trials` trials before it models them."""
    return max(3, min(10, trials // 3))


def begin(spec: StudySpec, prepared: Prepared) -> optuna.Study:
    """Open (or create) the study, store its definition, and recover what a killed run left.

    Called by the one process that holds a local file's lock, before any worker starts: a
    RUNNING trial there belongs to a process that no longer runs. On a database server other
    machines' trials may be running; Optuna's heartbeat finds the dead ones instead.
    """
    optuna.logging.set_verbosity(
        optuna.logging.WARNING
    )  # also before --workers: autotune says what happens itself
    study = storage.open_study(spec, create=True)
    schema.begin(
        study,
        target={"metric": spec.target.metric, "value": spec.target.value},
        optimizer=reference(prepared.task.optimizer) if prepared.task is not None else None,
        knobs=prepared.knobs if prepared.knobs != tuple(KNOBS) else None,
    )
    schema.record_definition(study, prepared.definition, changes=definition.changes)
    if storage.local_path(spec.storage) is not None:
        interrupted = storage.mark_running_interrupted(
            study, reason="the process stopped during this trial"
        )
        queued = set(storage.queue_retries(study))
        for number in interrupted:
            progress.say(
                f"autotune: trial {number} was interrupted; it is marked failed and "
                + (
                    "will run again"
                    if number in queued
                    else "a new trial takes its place (it stopped before its configuration was chosen)"
                )
            )
    if (
        spec.probe != "none"
        and schema.probe(study.user_attrs) is None
        and prepared.task is not None
        and probe.worth_probing(prepared.space)
    ):
        outcome = (
            roofline_probe.run(spec, prepared)
            if spec.probe == "joint"
            else run_probe(spec, prepared)
        )
        schema.record_probe(study, outcome)
        progress.tell(
            f"autotune: {probe.describe(outcome)}"
        )  # the report repeats it, so quiet hides it
    probed = with_probe(spec, prepared, study).space
    throughput_phase.ensure_phase(spec, prepared, study, probed)
    if (
        spec.first_trial != "sampled"
        and not study.get_trials(deepcopy=False)
        and spec.objective != SYSTEMS_ONLY
    ):
        plan, space = throughput_phase.plan_for(spec, prepared, study, probed)
        if spec.first_trial == "prior":
            enqueue_prior(study, space, prepared, trials=spec.budget.trials)
        else:
            # Under goodput the plan chooses the systems knobs: the baseline's maths is the first trial.
            baseline = (
                prepared.baseline
                if plan is None
                else {**prepared.baseline, **throughput_phase.chosen_systems(space)}
            )
            enqueue_baseline(study, space, baseline)
    return study


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
    study.enqueue_trial(values, user_attrs=schema.baseline_marker())


def enqueue_prior(study: optuna.Study, space: Space, prepared: Prepared, *, trials: int) -> None:
    """Make a new study's first trials the prior's (search/prior.py), marked as such. At most as
    many as TPE's random start-up trials: they take those trials' place, not its model's."""
    count = min(len(prior.LR_FACTORS), trials, startup_trials(trials))
    for params in prior.first_trials(
        space, prepared.baseline, train_samples=prepared.train_samples, count=count
    ):
        study.enqueue_trial(params, user_attrs=schema.prior_marker())


def run_probe(spec: StudySpec, prepared: Prepared) -> dict[str, Any]:
    """The systems probe (probe.py) with short runs of the study's task on a seed of its own."""
    epochs = min(probe.PROBE_EPOCHS, spec.budget.max_epochs)
    limits = Limits(
        target=math.inf, max_epochs=epochs, max_seconds=spec.budget.max_seconds, eval_every=epochs
    )

    def measure(config: dict[str, Any]) -> float:
        signals.check()
        try:
            result = prepared.run_trial(
                TrialConfig.from_mapping(complete(config)),
                limits=limits,
                device=prepared.device,
                seed=seeds.probe(spec.seed),
            )
        except isolation.TrialFailure:
            return math.inf
        bar.update(1)
        return result.train_seconds

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
    return {**outcome, **load.record()}


def with_probe(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> Prepared:
    """The space as the stored probe settled it; unchanged without one."""
    outcome = schema.probe(study.user_attrs)
    if spec.probe == "none" or outcome is None:
        return prepared
    return dataclasses.replace(prepared, space=probe.restrict(prepared.space, outcome))


def run_sequence(
    spec: StudySpec,
    prepared: Prepared,
    *,
    allow_changes: bool = False,
    run_trials: Callable[[], None] | None = None,
) -> optuna.Study:
    """The run, as `autotune run`, `autotune.tune` and the benchmarks all do it: under the signal
    handling and the runner's lock, take the study as it began, check it is unchanged, say the
    notices, run the trials (here, or `run_trials`: the workers of --workers), confirm the best.

    A signal ends it with `signals.Stopped` (a KeyboardInterrupt) once every trial this process
    was running is marked interrupted and queued again; the caller says so and how to go on.
    """
    with signals.handled(), runner_lock.sole_runner(spec, storage.local_path(spec.storage)):
        prepared = as_begun(spec, prepared)
        changes = check_unchanged(spec, prepared, allow_changes=allow_changes)
        print_notices(
            [*prepared.notices, *(f"going on after a change to the study: {c}" for c in changes)]
        )
        if run_trials is None:
            run_study(spec, prepared)
        else:
            begin(spec, prepared)  # recovery and the definition, before any worker starts
            run_trials()
        study = storage.open_study(spec, create=False)
        tell_measured_settings(spec, prepared, study)
        confirm_best(spec, prepared, study)
    return study


def tell_measured_settings(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> None:
    """systems_only: once the baseline's maths has trained, a trial for every other setting the
    throughput phase measured (throughput_phase.tell_settings). Told here, by the one process that then
    confirms, not by each of --workers: two workers telling at once would each add them all."""
    if spec.objective != SYSTEMS_ONLY:
        return
    probed = with_probe(spec, prepared, study)
    plan, _ = throughput_phase.plan_for(spec, probed, study, probed.space)
    trained = next(
        (
            t
            for t in study.get_trials(deepcopy=False)
            if schema.prediction(t) is not None and "from_trial" not in schema.prediction(t)
        ),
        None,
    )
    if plan is not None and trained is not None:
        throughput_phase.tell_settings(study, plan, trained)


def run_study(spec: StudySpec, prepared: Prepared, *, worker: int | None = None) -> optuna.Study:
    """Run trials until the budget's trials have finished, counting earlier runs and other
    workers', or until its timeout. `worker` is this process's index among `--workers`; None when
    it runs alone.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    timeout = spec.budget.timeout
    study = begin(spec, prepared) if worker is None else storage.open_study(spec, create=True)
    existing = len(study.get_trials(deepcopy=False))
    study = storage.open_study(
        spec, sampler=make_sampler(spec, stored_trials=existing, worker=worker), create=True
    )
    prepared = with_probe(spec, prepared, study)
    plan, space = throughput_phase.plan_for(spec, prepared, study, prepared.space)
    budget = trials_to_train(
        spec, study.get_trials(deepcopy=False)
    )  # systems_only's can grow below
    policy = one_trial.Policy(
        space=space,
        run_trial=prepared.run_trial,
        device=prepared.device,
        limits=limits_for(spec),
        seed=spec.seed,
        metric_name=spec.target.metric,
        budget=budget,
        prune=spec.prune == "incumbent",
        objective=objectives.of(spec.objective),
        replicates=spec.replicates,
        plan=plan,
        train_samples=prepared.train_samples,
    )
    started = time.monotonic()
    mine: list[int] = []  # the trials this process asked for
    # In lines mode one_trial prints a line per trial; the bar only announces the study (the
    # parent's, under --workers).
    with progress.bar("study", total=budget, unit="trial", announce=worker is None) as bar:
        try:
            while True:
                signals.check()
                storage.fail_dead_workers(study)
                # One read of the storage per trial: each costs milliseconds, and the tuner's own
                # time per trial is a benchmarked goal (benchmarks/overhead.py).
                trials = study.get_trials(deepcopy=False)
                if (
                    to_train := trials_to_train(spec, trials)
                ) != budget:  # systems_only's try that missed
                    budget = bar.total = to_train
                    policy = dataclasses.replace(policy, budget=budget)
                _show_progress(bar, trials, budget)
                # A queued trial (an interrupted one's retry) holds a slot, and is the next ask's to
                # run: the budget is spent only once none waits. (Run beyond the budget, by a
                # smaller --trials or another worker, it is marked surplus instead.)
                waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
                if (slots_taken(trials) >= budget and not waiting) or (
                    timeout is not None and time.monotonic() - started >= timeout
                ):
                    break
                one_trial.run_one(
                    study,
                    policy,
                    asked=mine,
                    known=trials,
                    # a local file has one runner (sole_runner); a server may have others
                    alone=worker is None and storage.local_path(spec.storage) is not None,
                )
        except KeyboardInterrupt as interrupt:
            # Wherever the signal landed (training, ask, tell), leave none of our trials RUNNING.
            stopped = storage.mark_running_interrupted(
                study, reason=f"stopped by {signals.name(interrupt)}", only=mine
            )
            storage.queue_retries(study, only=stopped)
            raise
    done = finished_count(study.get_trials(deepcopy=False))
    if done < budget and timeout is not None and time.monotonic() - started >= timeout:
        print(
            f"autotune: timeout of {timeout:g} s reached with {done} of {budget} trials finished; "
            f"run the same command again to go on",
            file=sys.stderr,
        )
    return study


def _show_progress(bar: progress.Bar, trials: list[optuna.trial.FrozenTrial], budget: int) -> None:
    bar.n = min(finished_count(trials), budget)
    best = one_trial.incumbent(trials)
    if best is not None:
        bar.set_postfix_str(f"best {best[0]:.2f}s (trial {best[1]})", refresh=False)
    bar.refresh()


def confirm_best(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> dict[str, Any] | None:
    """Re-run the best feasible configurations and the baseline on fresh seeds; store the outcome.

    Reused without training when the stored confirmation covers the same finished trials.
    """
    if spec.confirm.top == 0 or spec.confirm.runs == 0:
        return None
    trials = study.get_trials(deepcopy=False)
    top = sorted((t for t in trials if schema.is_feasible(t)), key=lambda t: (t.value, t.number))[
        : spec.confirm.top
    ]
    if not top:
        return None
    after = finished_count(trials)
    stored = schema.confirmation(study.user_attrs)
    numbers = [t.number for t in top]
    if (
        stored
        and stored.get("after_trials") == after
        and stored.get("trials") == numbers
        and stored.get("objective", TIME_TO_TARGET) == spec.objective
        and stored.get("precision_checked", False) == spec.confirm.precision
    ):
        return stored
    configs = {t.number: schema.config(t) for t in trials if t.number in numbers}
    # A trial that is the baseline (its first trial, or a sampled twin) is measured once, as the baseline.
    candidates = {
        verdict.label(n): configs[n] for n in numbers if configs[n] != complete(prepared.baseline)
    }
    candidates = {verdict.BASELINE: prepared.baseline, **candidates}
    fastest = verdict.label(numbers[0])
    twin = (
        verdict.fp32_twin(fastest, candidates[fastest])
        if spec.confirm.precision and fastest in candidates
        else None
    )
    if twin is not None:
        candidates[twin[0]] = twin[1]
    fresh_seeds = seeds.fresh(spec.seed, spec.confirm.runs)
    limits = limits_for(spec)
    # Told apart by time to target only: a fixed schedule's runs all take about as long.
    until_resolved = spec.confirm.baseline == "until_resolved" and spec.objective != FIXED_SCHEDULE
    with progress.bar(
        "confirming on fresh seeds",
        total=len(fresh_seeds) * len(candidates),
        unit="run",
        leave=False,
    ) as bar:
        with signals.interruptible():
            runs = confirm.measure(
                prepared.run_trial,
                candidates,
                seeds=fresh_seeds,
                limits=limits,
                device=prepared.device,
                on_run=lambda: (bar.update(1), signals.check()),
                until_resolved=until_resolved,
            )
    outcome = {
        "after_trials": after,
        "trials": numbers,
        "configs": candidates,
        "seeds": fresh_seeds,
        "runs": runs,
        "objective": spec.objective,
        "target": spec.target.value,
        "baseline_resolved_by": verdict.RESOLVED_BY if until_resolved else None,
        "precision_checked": spec.confirm.precision,
    }
    predicted = {
        verdict.label(t.number): t.value
        for t in top
        if schema.prediction(t) is not None and verdict.label(t.number) in candidates
    }
    if predicted:  # goodput: the search's predicted times, to set beside the measured ones
        outcome["predicted"] = predicted
    if twin is not None:
        outcome["precision_effect"] = verdict.precision_effect(
            runs, fastest, candidates[fastest]["precision"]
        )
    schema.record_confirmation(study, json.loads(json.dumps(outcome)))
    return outcome
