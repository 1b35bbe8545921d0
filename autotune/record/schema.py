"""What a study stores, in one place: every attribute key, how trials and studies are written and
read back, and the older layout (version 0, without `schema_version`: only `_V0` below reads it).
Everything else reads and writes a study through these functions; what follows from what they
read, with no key of its own, is derived.py's. Trials and studies are duck-typed (Optuna's Trial,
FrozenTrial and Study), so the report reads a storage without importing Optuna here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.search.space import complete

SCHEMA_VERSION = 1

# Study attributes.
VERSION = "schema_version"
TARGET = "target"  # {"metric": name, "value": threshold}
# the task's optimizer factory as `module:function`, for `export --format torch`
OPTIMIZER = "optimizer"
KNOBS_READ = "knobs"  # the knobs an objective function reads, where that is not all of them
DEFINITION = "definition"  # what the trials were measured under (definition.py)
DEFINITION_CHANGES = "definition_changes"  # each allowed change, with the trial it began at
PROBE = "probe"  # the systems probe's outcome (probe/run.py)
PROBE_SO_FAR = "probe_measurements"  # a probe's or confirmation's, until it is stored
PROBING = "probing"  # {worker, at}: the process probing it, renewed as it goes (probe_claim.py)
CONFIRMATION = "confirmation"  # the confirmation's runs and what they covered (confirm.py)
THROUGHPUT = "throughput"  # the table goodput trials are timed by (probe/model/goodput.py)
_STUDY_KEYS = (VERSION, TARGET, OPTIMIZER, KNOBS_READ, DEFINITION, DEFINITION_CHANGES, PROBE)
_STUDY_KEYS += (PROBE_SO_FAR, PROBING, CONFIRMATION, THROUGHPUT)

# Trial attributes.
WORKER = "worker"  # host:pid of the process that ran it, so a process marks only its own
TRAINED_CONFIG = "config"  # the configuration it trained (the params: the one sampled)
SEED = "seed"
DEVICES = "devices"  # the GPUs (CUDA_VISIBLE_DEVICES ids) of the --workers worker that ran it
# {other_cores, cores}: the cores other processes kept busy while its runs trained (measure.py)
OTHER_LOAD = "other_load"
REASON = "reason"  # why it was pruned or failed; autotune records one for every end of its own
PRUNED_AT = "pruned_at"  # training seconds spent before it was pruned
PAUSED_AT = "paused_at"  # and seconds off the training clock (evaluating) until then
OOM = "oom"  # it ran out of memory
OOM_BOUND = "oom_bound"  # pruned unrun: the trial whose smaller configuration ran out of memory
TOO_LARGE = "too_large"  # pruned unrun: its effective batch is larger than the training set
DIVERGED = "diverged"  # pruned at a non-finite loss or metric
# what its training measured (train.config.TrialResult as a dict, plus replicates)
RESULT = "result"
# In RESULT under goodput and systems_only: the trial's predicted time, what it is made of and the
# configuration trained (TRAINED_CONFIG is then the fastest way to train the same maths).
PREDICTION = "prediction"
INTERRUPTED = "interrupted"  # stopped by Ctrl-C, a signal or a kill; its configuration runs again
SURPLUS = "surplus"  # asked for by a worker after others took the whole budget; never ran
BASELINE = "baseline"  # the study's baseline, queued as its first trial (first_trial: baseline)
# one of a new study's first trials, queued from the prior (first_trial: prior, search/prior.py)
PRIOR = "prior"
FAILED_TRIAL, RETRY_HISTORY = "failed_trial", "retry_history"  # system attrs: Optuna's retries

# Version 0: before RESULT, each measured figure was a trial attribute of its own.
_V0_MEASURED = tuple(
    "reached time_to_target best_metric train_seconds epochs optimizer_steps samples_per_second "
    "peak_memory_bytes device_name torch_version stop_reason curve".split()
)


# Writing a study.


def begin_study(
    study: Any, *, target: Mapping[str, Any], optimizer: str | None, knobs: Iterable[str] | None
) -> None:
    """What a run records as it opens a study; the version only on a study it creates."""
    if not study.get_trials(deepcopy=False) and VERSION not in study.user_attrs:
        study.set_user_attr(VERSION, SCHEMA_VERSION)
    study.set_user_attr(TARGET, dict(target))
    if optimizer is not None:
        study.set_user_attr(OPTIMIZER, optimizer)
    if knobs is not None:
        study.set_user_attr(KNOBS_READ, list(knobs))


def record_definition(study: Any, definition: Mapping[str, Any], *, changes: Any) -> None:
    """The definition as the study begins, then each allowed change (`changes(stored, new)`)."""
    stored = study.user_attrs.get(DEFINITION)
    if stored == definition:
        return
    if stored is not None:
        change = {"from_trial": len(study.get_trials(deepcopy=False))}
        change["changes"] = changes(stored, definition)
        history = [*study.user_attrs.get(DEFINITION_CHANGES, []), change]
        study.set_user_attr(DEFINITION_CHANGES, history)
    study.set_user_attr(DEFINITION, dict(definition))


def record_probe(study: Any, outcome: Mapping[str, Any]) -> None:
    _record_kept_for(study, PROBE, outcome, kept=PROBE_SO_FAR)


def record_probe_so_far(study: Any, kept: Mapping[str, Any]) -> None:
    study.set_user_attr(PROBE_SO_FAR, dict(kept))


def record_probing(study: Any, mark: Mapping[str, Any]) -> None:
    study.set_user_attr(PROBING, dict(mark))


def record_confirmation(study: Any, outcome: Mapping[str, Any]) -> None:
    _record_kept_for(study, CONFIRMATION, outcome, kept=PROBE_SO_FAR)


def record_throughput(study: Any, phase: Mapping[str, Any]) -> None:
    _record_kept_for(study, THROUGHPUT, phase, kept=PROBE_SO_FAR)


def _record_kept_for(study: Any, key: str, value: Mapping[str, Any], *, kept: str) -> None:
    """`value` under `key`; the measurements kept under `kept` until it is stored let go."""
    study.set_user_attr(key, dict(value))
    if study.user_attrs.get(kept):
        study.set_user_attr(kept, {})


# Writing a trial.


def begin_trial(
    trial: Any, *, worker: str, trained: Mapping[str, Any], seed: int, devices: list[str] | None
) -> None:
    """A trial as it begins: the configuration it trains (its params, as Optuna stores them, are
    the one sampled), its seed, and who runs it."""
    trial.set_user_attr(WORKER, worker)
    trial.set_user_attr(TRAINED_CONFIG, dict(trained))
    trial.set_user_attr(SEED, seed)
    if devices is not None:
        trial.set_user_attr(DEVICES, list(devices))


def record_trained_config(trial: Any, config: Mapping[str, Any]) -> None:
    """The configuration to name for the trial once it differs from the one begun (goodput)."""
    trial.set_user_attr(TRAINED_CONFIG, dict(config))


def record_surplus(trial: Any) -> None:
    trial.set_user_attr(SURPLUS, True)
    trial.set_user_attr(REASON, "surplus: other workers had already taken the whole budget")


def record_unrun(trial: Any, *, reason: str, bound: int | None = None) -> None:
    """Pruned before it trained: past the OOM boundary of trial `bound`, or (None) too large."""
    trial.set_user_attr(REASON, reason)
    trial.set_user_attr(*((OOM_BOUND, bound) if bound is not None else (TOO_LARGE, True)))


def record_pruned(
    trial: Any, *, reason: str, seconds: float | None, paused: float | None = None
) -> None:
    trial.set_user_attr(REASON, reason)
    if seconds is not None:  # the compute it took counts toward the study's, evaluations apart
        trial.set_user_attr(PRUNED_AT, seconds)
        trial.set_user_attr(PAUSED_AT, paused)


def record_failure(trial: Any, *, reason: str, oom: bool, diverged: bool) -> None:
    trial.set_user_attr(REASON, reason)
    trial.set_user_attr(OOM, oom)
    if diverged:
        trial.set_user_attr(DIVERGED, True)


def record_other_load(trial: Any, load: Mapping[str, Any]) -> None:
    trial.set_user_attr(OTHER_LOAD, dict(load))


def other_load(trial: Any) -> dict[str, Any] | None:
    """The load other processes put on the cores while the trial trained; None before it was
    measured."""
    return trial.user_attrs.get(OTHER_LOAD)


def record_result(trial: Any, record: Mapping[str, Any]) -> None:
    trial.set_user_attr(RESULT, dict(record))  # one write: each attribute is its own transaction


def record_interrupted(storage: Any, trial_id: int, *, reason: str) -> None:
    """Mark a trial another process began (through the storage: Optuna has no public call)."""
    storage.set_trial_user_attr(trial_id, INTERRUPTED, True)
    storage.set_trial_user_attr(trial_id, REASON, f"interrupted: {reason}")


# Reading a study.


def version(study_attrs: Mapping[str, Any]) -> int:
    return int(study_attrs.get(VERSION, 0))


def optimizer(study_attrs: Mapping[str, Any]) -> str | None:
    """The task's optimizer reference as stored."""
    return study_attrs.get(OPTIMIZER)


def knobs_read(study_attrs: Mapping[str, Any]) -> list[str] | None:
    """The knobs the study's training reads, where it stored them (else it reads them all)."""
    return None if (stored := study_attrs.get(KNOBS_READ)) is None else list(stored)


def made_by_autotune(study_attrs: Mapping[str, Any], *, trials: int, minimize: bool) -> bool:
    """It holds an attribute only autotune writes, or nothing at all (a run stopped as it made
    it)."""
    written = any(key in study_attrs for key in _STUDY_KEYS)
    return written or (not study_attrs and trials == 0 and minimize)


def definition(study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    return study_attrs.get(DEFINITION)


def device(study_attrs: Mapping[str, Any]) -> str | None:
    return (definition(study_attrs) or {}).get("device")


def devices_per_trial(study_attrs: Mapping[str, Any]) -> int:
    """The devices each trial trained on; a definition without the key: one."""
    return (definition(study_attrs) or {}).get("devices_per_trial", 1)


def probe(study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    return study_attrs.get(PROBE)


def probe_so_far(study_attrs: Mapping[str, Any]) -> dict[str, Any]:
    return study_attrs.get(PROBE_SO_FAR) or {}


def probing(study_attrs: Mapping[str, Any]) -> dict[str, Any]:
    return study_attrs.get(PROBING) or {}


def confirmation(study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    return study_attrs.get(CONFIRMATION)


def throughput(study_attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    return study_attrs.get(THROUGHPUT)


# Reading a trial.


def trained_config(trial: Any) -> dict[str, Any] | None:
    """The configuration it trained, knobs newer than the study filled in; None if none chosen."""
    return None if (stored := trial.user_attrs.get(TRAINED_CONFIG)) is None else complete(stored)


def seed(trial: Any) -> int | None:
    """The seed of its first run; None for a trial that never ran."""
    return trial.user_attrs.get(SEED)


def devices(trial: Any) -> list[str] | None:
    """The GPUs its --workers worker was given; None where no worker was given any."""
    return trial.user_attrs.get(DEVICES)


def reason(trial: Any) -> str | None:
    return trial.user_attrs.get(REASON)


def is_interrupted(trial: Any) -> bool:
    """A FAIL trial stopped from outside: by Ctrl-C, a signal, a kill (marked at the next start)
    or a database server's heartbeat check; autotune stores why each failure of its own ended."""
    attrs = trial.user_attrs
    return trial.state.name == "FAIL" and (bool(attrs.get(INTERRUPTED)) or REASON not in attrs)


def is_surplus(trial: Any) -> bool:
    return bool(trial.user_attrs.get(SURPLUS))


def is_unrun(trial: Any) -> bool:
    """Pruned without running: past the OOM boundary, or its effective batch too large."""
    return OOM_BOUND in trial.user_attrs or TOO_LARGE in trial.user_attrs


def queue_mark(kind: str) -> dict[str, Any]:
    """The user attrs of a queued trial that is the baseline (`kind` BASELINE) or drawn from the
    prior (PRIOR); a retry of it carries them too."""
    return {kind: True}


def is_baseline(trial: Any) -> bool:
    return bool(trial.user_attrs.get(BASELINE))


def queue_marks(trial: Any) -> dict[str, Any]:
    """The marks of how a queued trial came to be (the baseline, the prior), for its retry."""
    return {key: True for key in (BASELINE, PRIOR) if trial.user_attrs.get(key)}


def prediction(trial: Any) -> dict[str, Any] | None:
    """A goodput trial's predicted time and what it is made of; None for any other trial."""
    return measured(trial).get(PREDICTION)


def ran_out_of_memory(trial: Any) -> bool:
    """Pruned because it really ran out of memory (not bounded by another that did)."""
    attrs = trial.user_attrs
    return trial.state.name == "PRUNED" and bool(attrs.get(OOM)) and TRAINED_CONFIG in attrs


def measured(trial: Any) -> dict[str, Any]:
    """What the trial's training measured (time_to_target, curve, ...); empty if it did not end."""
    attrs = trial.user_attrs
    return dict(attrs.get(RESULT) or {k: v for k, v in attrs.items() if k in _V0_MEASURED})


def stored_end(trial: Any) -> dict[str, Any]:
    """All the trial stored of its end: why, out of memory, bounded, diverged, what it measured."""
    attrs = trial.user_attrs
    return {
        "reason": attrs.get(REASON),
        "oom": bool(attrs.get(OOM, False)),
        "oom_bound": OOM_BOUND in attrs,  # pruned unrun: a smaller one ran out of memory
        "too_large": TOO_LARGE in attrs,  # pruned unrun: no epoch holds its effective batch
        "diverged": bool(attrs.get(DIVERGED, False)),
        "pruned_at": attrs.get(PRUNED_AT),
        **measured(trial),
    }


def run_seconds(trial: Any) -> tuple[float, float | None]:
    """Seconds its runs spent on the training clock and off it (evaluating), a pruned one's until
    it stopped; off it None where no run said (a command's runs, a trial stored before it was)."""
    result, attrs = measured(trial), trial.user_attrs
    runs = result.get("replicates") or ([result] if "train_seconds" in result else [])
    if not runs:
        return float(attrs.get(PRUNED_AT, 0.0)), attrs.get(PAUSED_AT)
    paused = [r.get("paused_seconds") for r in runs]
    return sum(r["train_seconds"] for r in runs), None if None in paused else sum(paused)


def retried_from(trial: Any) -> int | None:
    """The trial this one retries (Optuna's retry callback), if any."""
    return trial.system_attrs.get(FAILED_TRIAL)


def retry_attrs(trial: Any) -> dict[str, Any]:
    """A retry's system attributes, as Optuna's RetryFailedTrialCallback writes them."""
    history = [*trial.system_attrs.get(RETRY_HISTORY, []), trial.number]
    return {FAILED_TRIAL: trial.number, RETRY_HISTORY: history}
