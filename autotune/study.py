"""The Optuna study: storage, sampler, the ask/run/tell loop, resume and confirmation.

This is the only module that imports Optuna. Everything a trial records goes on the Optuna
trial as user attributes, so reports are made from the storage alone.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import optuna
import torch
from tqdm import tqdm

from autotune import confirm, memory, results, space as space_
from autotune.errors import SpecError, StorageError
from autotune.spec import StudySpec
from autotune.tasks import Task, load_task
from autotune.trial import Limits, TrialConfig, run

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
INTERRUPTED = "interrupted"  # user attr on a trial stopped by Ctrl-C or a kill; it is retried


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a run needs beyond the spec, resolved before the storage is touched."""

    task: Task
    device: torch.device
    space: space_.Space
    baseline: dict[str, Any]
    notices: list[str]


def resolve_device(spec: StudySpec) -> torch.device:
    if spec.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec.device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SpecError(spec.path, "device", spec.device, "no CUDA device is available here; use auto or cpu")
        if (device.index or 0) >= count:
            raise SpecError(spec.path, "device", spec.device, f"this machine has cuda:0 to cuda:{count - 1}")
    return device


def prepare(spec: StudySpec) -> Prepared:
    """Resolve the device, build the task and fit the space to the device; all errors are the user's."""
    device = resolve_device(spec)
    cuda = device.type == "cuda"
    bf16 = torch.cuda.is_bf16_supported() if cuda else True
    space, notices, impossible = space_.restrict_to_device(spec.space, cuda=cuda, bf16=bf16)
    for knob, reason in impossible.items():
        raise SpecError(spec.path, f"space.{knob}", spec.space[knob].values, f"{reason} ({device.type})")
    baseline = dict(spec.baseline)
    unsupported = space_.unsupported_precisions(cuda=cuda, bf16=bf16)
    if baseline["precision"] in unsupported:
        reason = unsupported[baseline["precision"]]
        raise SpecError(spec.path, "baseline.precision", baseline["precision"], f"{reason}; choose a precision this {device.type} device runs")
    baseline["pin_memory"] = baseline["pin_memory"] and cuda
    task = load_task(spec.task, study_path=spec.path)
    if spec.target.metric != task.metric_name:
        raise SpecError(spec.path, "target.metric", spec.target.metric, f"task {spec.task} measures {task.metric_name!r}")
    return Prepared(task=task, device=device, space=space, baseline=baseline, notices=notices)


def open_study(spec: StudySpec, *, seed_offset: int = 0, create: bool = True) -> optuna.Study:
    """The study in its storage, created on first use; its sampler reseeded past earlier runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # `group` is experimental
        sampler = optuna.samplers.TPESampler(
            seed=spec.seed + seed_offset,
            n_startup_trials=max(3, min(10, spec.budget.trials // 3)),  # random trials before TPE models
            multivariate=True,  # knobs interact (lr with batch size and schedule)
            group=True,  # prefetch_factor exists only with workers
        )
    if not create and spec.storage.startswith("sqlite:///"):
        # Opening a SQLite URL creates the file; a report must not leave an empty database behind.
        path = spec.storage.removeprefix("sqlite:///")
        if not Path(path).is_file():
            raise StorageError(f"{spec.path}: storage: no database at {path}; run `autotune run {spec.path}` first")
    try:
        if create:
            return optuna.create_study(
                study_name=spec.name, storage=spec.storage, sampler=sampler, direction="minimize", load_if_exists=True
            )
        return optuna.load_study(study_name=spec.name, storage=spec.storage, sampler=sampler)
    except KeyError:
        raise StorageError(f"{spec.path}: no study named {spec.name!r} in {spec.storage}; run `autotune run {spec.path}` first") from None
    except Exception as exc:  # SQLAlchemy and driver errors: an unreachable or unusable storage
        raise StorageError(f"{spec.path}: storage: cannot open {spec.storage!r} ({exc.__class__.__name__}: {str(exc).splitlines()[0]})") from None


def finished_count(study: optuna.Study) -> int:
    """Trials that count against the budget: every finished one except those interrupted."""
    return sum(1 for t in study.get_trials(deepcopy=False, states=FINISHED) if not t.user_attrs.get(INTERRUPTED))


def recover_interrupted(study: optuna.Study, *, reason: str) -> list[int]:
    """Mark RUNNING trials as failed (interrupted) and queue their configuration again.

    The default storage is one SQLite file used by one process, so a RUNNING trial at start-up
    belongs to a process that no longer runs, and one after Ctrl-C is this process's own.
    """
    recovered = []
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.enqueue_trial(frozen.params, user_attrs={"retry_of": frozen.number}, skip_if_exists=False)
        storage = study._storage  # Optuna has no public call to finish another process's trial
        storage.set_trial_user_attr(frozen._trial_id, INTERRUPTED, True)
        storage.set_trial_user_attr(frozen._trial_id, "reason", f"interrupted: {reason}")
        storage.set_trial_state_values(frozen._trial_id, optuna.trial.TrialState.FAIL)
        recovered.append(frozen.number)
    return recovered


def limits_for(spec: StudySpec) -> Limits:
    """What every training run of the study stops at: the target or the per-trial budget."""
    b = spec.budget
    return Limits(target=spec.target.value, max_epochs=b.max_epochs, max_seconds=b.max_seconds, eval_every=b.eval_every)


def run_study(spec: StudySpec, prepared: Prepared, *, trials: int | None = None, timeout: float | None = None) -> optuna.Study:
    """Run trials until `trials` (default: the spec's budget) have finished, counting earlier runs."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budget = trials if trials is not None else spec.budget.trials
    timeout = timeout if timeout is not None else spec.budget.timeout
    # Reseed the sampler past the trials already stored, or a resumed study would propose its
    # first random configurations all over again.
    existing = len(open_study(spec).get_trials(deepcopy=False))
    study = open_study(spec, seed_offset=existing)
    study.set_user_attr("target", {"metric": spec.target.metric, "value": spec.target.value})
    for number in recover_interrupted(study, reason="the process stopped during this trial"):
        tqdm.write(f"autotune: trial {number} was interrupted; it is marked failed and will run again", file=sys.stderr)
    limits = limits_for(spec)
    started = time.monotonic()
    done = finished_count(study)
    with tqdm(total=budget, initial=min(done, budget), desc="study", unit="trial", dynamic_ncols=True) as bar:
        _show_best(bar, study)
        try:
            while done < budget and (timeout is None or time.monotonic() - started < timeout):
                run_one(study, prepared, limits=limits, seed=spec.seed, metric_name=spec.target.metric)
                done = finished_count(study)
                bar.n = min(done, budget)
                _show_best(bar, study)
        except KeyboardInterrupt:
            # Wherever Ctrl-C landed (training, ask, tell), leave no trial RUNNING.
            recover_interrupted(study, reason="stopped by the user (Ctrl-C)")
            raise
    if done < budget:
        print(f"autotune: timeout of {timeout:g} s reached with {done} of {budget} trials finished; "
              f"run the same command again to go on", file=sys.stderr)
    return study


def run_one(study: optuna.Study, prepared: Prepared, *, limits: Limits, seed: int, metric_name: str) -> None:
    """Ask for a configuration, train it, tell the outcome. OOM -> PRUNED, other errors -> FAIL."""
    trial = study.ask()
    config = space_.suggest(prepared.space, trial)
    trial_seed = seed * 100_000 + trial.number
    trial.set_user_attr("config", config)
    trial.set_user_attr("seed", trial_seed)
    bar = tqdm(desc=f"trial {trial.number}", unit="step", leave=False, dynamic_ncols=True)

    def progress(steps: int, total: int, metric: float | None) -> None:
        bar.total = total
        bar.update(steps - bar.n)
        if metric is not None:
            bar.set_postfix_str(f"{metric_name}={metric:.4f}", refresh=False)

    failure: tuple[str, bool] | None = None
    try:
        result = run(prepared.task, TrialConfig.from_mapping(config), limits=limits, device=prepared.device,
                     seed=trial_seed, progress=progress)
    except Exception as exc:
        failure = (memory.oom_reason(exc), True) if memory.is_oom(exc) else (_error_reason(exc), False)
        # Leaving the except block drops the traceback, and with it the trial's tensors.
    bar.close()
    if failure is not None:
        memory.free_memory()
        reason, oom = failure
        trial.set_user_attr("reason", reason)
        trial.set_user_attr("oom", oom)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED if oom else optuna.trial.TrialState.FAIL)
        tqdm.write(f"trial {trial.number}: {'pruned' if oom else 'failed'}: {reason}", file=sys.stderr)
        return
    record = dataclasses.asdict(result)
    record["curve"] = [list(point) for point in result.curve]
    for key, value in record.items():
        trial.set_user_attr(key, value)
    trial.set_constraint("target", limits.target - result.best_metric)  # feasible when <= 0
    study.tell(trial, result.time_to_target if result.reached else result.train_seconds)


def _error_reason(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{exc.__class__.__name__}: {first_line}{where}"[:500]


def _show_best(bar: tqdm, study: optuna.Study) -> None:
    try:
        best = study.best_trial
    except ValueError:  # no feasible trial yet
        return
    if best.constraints and max(best.constraints.values()) > 0:
        return
    bar.set_postfix_str(f"best {best.value:.2f}s (trial {best.number})")


def confirm_best(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> dict[str, Any] | None:
    """Re-run the best feasible configurations and the baseline on fresh seeds; store the outcome.

    Reused without training when the stored confirmation covers the same finished trials.
    """
    if spec.confirm.top == 0 or spec.confirm.runs == 0:
        return None
    trials = study.get_trials(deepcopy=False)
    records = results.trial_records(trials)
    top = results.best_feasible(records, count=spec.confirm.top)
    if top.empty:
        return None
    after = finished_count(study)
    stored = study.user_attrs.get("confirmation")
    numbers = [int(n) for n in top["number"]]
    if stored and stored.get("after_trials") == after and stored.get("trials") == numbers:
        return stored
    configs = {t.number: t.user_attrs["config"] for t in trials if t.number in numbers}
    candidates = {f"trial {n}": space_.complete(configs[n]) for n in numbers}
    candidates = {confirm.BASELINE: prepared.baseline, **candidates}
    seeds = confirm.fresh_seeds(spec.seed, spec.confirm.runs)
    limits = limits_for(spec)
    with tqdm(total=len(seeds) * len(candidates), desc="confirming on fresh seeds", unit="run", leave=False) as bar:
        runs = confirm.measure(prepared.task, candidates, seeds=seeds, limits=limits, device=prepared.device,
                               on_run=lambda: bar.update(1))
    outcome = {"after_trials": after, "trials": numbers, "configs": candidates, "seeds": seeds, "runs": runs}
    study.set_user_attr("confirmation", json.loads(json.dumps(outcome)))
    return outcome


def print_notices(notices: list[str]) -> None:
    for notice in notices:
        print(f"autotune: notice: {notice}", file=sys.stderr)
