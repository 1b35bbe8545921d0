"""`autotune run STUDY --workers K`: K worker processes on one study.

Each worker is `autotune run STUDY --as-worker I` on the same storage, running the ask/train/tell
loop until the budget is taken (run.run_as_worker). The workers share the machine deliberately:
each gets its own share of the CPU cores (torch's threads follow the affinity, so K workers on
N cores never run more than N threads between them) and, on a machine with M GPUs, M / K GPUs of
its own through CUDA_VISIBLE_DEVICES, so that no two trials ever share a card (each would time
the other's work); each trial stores the GPUs it ran on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import torch

from autotune import progress, signals
from autotune.errors import AutotuneError
from autotune.runners import watchdog
from autotune.spec.study_file import StudySpec
from autotune.storage import opening
from autotune.study.budget import finished_count, trials_to_train
from autotune.train.measure import cpu_count

STOP_GRACE_SECONDS = 60  # after a signal, how long workers get to mark their trials before a kill
PARENT = signals.WORKERS_PARENT
GPUS = "AUTOTUNE_WORKER_GPUS"  # a worker's GPUs, as the parent gave them (comma-separated ids)
# when the parent started the worker (time.time()): its --timeout counts from then, not from once
# it has imported torch and prepared the task, seconds later
SPAWNED = "AUTOTUNE_WORKER_SPAWNED"
# For tests, on a machine without GPUs: share out this many GPU ids as if the machine had them
# (the trials still train on the study's device).
SIMULATED_GPUS = "AUTOTUNE_SIMULATED_GPUS"
WATCH_SECONDS = 0.5  # how often a worker checks that its parent still runs


def check_storage(spec: StudySpec, workers: int) -> None:
    """Several processes never write one SQLite file: Optuna's journal file or a server instead."""
    if workers > 1 and spec.storage.startswith("sqlite"):
        raise AutotuneError(
            f"{spec.path}: --workers {workers} needs a storage that several processes can share; "
            f"{spec.storage} is a SQLite file, written by one process at a time. Use --storage "
            f"journal:///{spec.path.with_suffix('.journal')} (this machine) "
            f"or postgresql://user@host/db (several machines)"
        )


def usable(spec: StudySpec, requested: int) -> int:
    """The workers worth starting: no more than the budget has trials, nor the cores this process
    may use (each worker's torch threads need one). Fewer than asked are said in a notice."""
    cores = cpu_count()
    count = min(requested, spec.budget.trials, cores)
    if count < requested:
        limits = [
            f"the budget has {spec.budget.trials} trial(s)"
            if spec.budget.trials < requested
            else "",
            f"this process may use {cores} CPU core(s)" if cores < requested else "",
        ]
        why = ", ".join(w for w in limits if w)
        progress.say(
            f"autotune: --workers {requested} is more than can be used ({why}); starting {count}"
        )
    return count


def gpu_ids(spec: StudySpec) -> list[str]:
    """The GPUs --workers shares out: those this process sees (CUDA_VISIBLE_DEVICES's ids, else
    every one; the one a `device: cuda:N` names), none for a CPU study; AUTOTUNE_SIMULATED_GPUS
    stands in for them in tests."""
    simulated = os.environ.get(SIMULATED_GPUS)
    if simulated:
        return [str(i) for i in range(int(simulated))]
    if spec.device == "cpu" or not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [v.strip() for v in visible.split(",")][:count] if visible else list(map(str, range(count)))
    )
    if spec.device.startswith("cuda:"):
        return [ids[int(spec.device.partition(":")[2])]]
    return ids


def gpu_shares(spec: StudySpec, workers: int, gpus: Sequence[str]) -> list[list[str]]:
    """Each worker's GPUs: len(gpus) // workers of them, none shared; no GPU for any on a CPU."""
    if not gpus:
        return [[] for _ in range(workers)]
    per_trial = spec.devices_per_trial
    if workers * per_trial > len(gpus):
        most = len(gpus) // per_trial
        fits = (
            f"run --workers {most} or fewer"
            if most
            else f"devices_per_trial is at most {len(gpus)} here"
        )
        raise AutotuneError(
            f"{spec.path}: --workers {workers} with devices_per_trial {per_trial} needs "
            f"{workers * per_trial} GPUs, no two trials sharing one (each would time the other's "
            f"work); this machine has {len(gpus)} ({', '.join(gpus)}): {fits}"
        )
    size = len(gpus) // workers
    return [list(gpus[i * size : (i + 1) * size]) for i in range(workers)]


def assigned_gpus() -> list[str] | None:
    """In a worker: the GPUs its parent gave it; None outside --workers or without GPUs."""
    given = os.environ.get(GPUS)
    return given.split(",") if given else None


def core_share(index: int, workers: int, cores: Sequence[int]) -> set[int]:
    """The cores worker `index` runs on: a contiguous share, or one core when workers outnumber
    cores."""
    if workers >= len(cores):
        return {cores[index % len(cores)]}
    size = len(cores) // workers
    start = index * size
    return set(cores[start : start + size] if index < workers - 1 else cores[start:])


def worker_env(gpus: Sequence[str]) -> dict[str, str]:
    """A worker's environment: its GPUs alone visible to it."""
    # One progress bar, the parent's; in lines mode each worker prints its own trials' lines.
    env = {**os.environ, "TQDM_DISABLE": "1", PARENT: str(os.getpid()), SPAWNED: repr(time.time())}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = env[GPUS] = ",".join(gpus)
    return env


def run_workers(
    spec: StudySpec,
    *,
    study_file: str,
    workers: int,
    options: Sequence[str] = (),
    gpus: Sequence[Sequence[str]] = (),
) -> None:
    """Start the workers, show the study's progress, and wait for them; a signal stops them all.
    Each runs to the budget of `spec` (the study file with the command line's overrides), with
    its share of `gpus` (gpu_shares) where there are any."""
    budget, timeout = spec.budget.trials, spec.budget.timeout
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(cpu_count()))
    )
    command = [
        sys.executable,
        "-m",
        "autotune",
        "run",
        study_file,
        "--storage",
        spec.storage,
        "--trials",
        str(budget),
        *(["--timeout", repr(timeout)] if timeout is not None else []),
        *options,
    ]
    processes = []
    for index in range(workers):
        # A session of its own: Ctrl-C at the terminal reaches this process alone, which passes it
        # on (_stop), so that K workers starting up do not each answer it.
        process = subprocess.Popen(
            [*command, "--as-worker", str(index)],
            env=worker_env(gpus[index] if gpus else ()),
            start_new_session=True,
        )
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(process.pid, core_share(index, workers, cores))
        processes.append(process)
    study = opening.open_study(spec, create=False)
    try:
        # systems_only: its tries
        to_train = trials_to_train(spec, study.get_trials(deepcopy=False))
        with progress.bar(f"study ({workers} workers)", total=to_train, unit="trial") as bar:
            while running := [p for p in processes if p.poll() is None]:
                # a second between looks at the storage; the moment the last worker ends, no more
                with signals.interruptible(), contextlib.suppress(subprocess.TimeoutExpired):
                    running[0].wait(timeout=1.0)
                trials = study.get_trials(deepcopy=False)
                bar.total = to_train = trials_to_train(spec, trials)
                bar.n = min(finished_count(trials), to_train)
                bar.refresh()
    except KeyboardInterrupt as interrupt:
        signum = interrupt.signum if isinstance(interrupt, signals.Stopped) else 2
        _stop(processes, signum)
        raise
    failed = [(i, p.returncode) for i, p in enumerate(processes) if p.returncode != 0]
    if failed:
        codes = ", ".join(f"worker {i} exited with status {code}" for i, code in failed)
        raise AutotuneError(
            f"{spec.path}: {codes}; every finished trial is saved, "
            f"run the same command again to go on"
        )


def die_with_parent() -> None:
    """In a worker: stop as a SIGTERM would stop it (its trial marked and queued again) once the
    `autotune run` that started it is gone, killed with SIGKILL say, and exit for good after the
    grace a parent would have given it. An orphan would go on training beside the next run."""

    def stop() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    parent = os.environ.get(PARENT)
    if parent:
        watchdog.on_death(int(parent), stop, every=WATCH_SECONDS)


def _stop(processes: list[subprocess.Popen], signum: int) -> None:
    """Pass the signal on, give each worker time to mark its trial, then kill what is left."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signum)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()  # its trial stays RUNNING; the next start marks and retries it
            process.wait()
