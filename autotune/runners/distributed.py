"""A trial on several devices (`devices_per_trial: N`): N fresh child processes, one rank each,
joined in a torch.distributed process group on a port of the trial's own.

The study's process watches every rank. Rank 0 reports progress and the result; the first rank to
fail (out of memory, an error, a crash) names the trial's reason, and the others, which would
wait on it in a collective, are killed at once. A trial that says nothing within its wall-clock
limit is killed whole. Each rank is a trial's child as isolation.py starts one (trial_process.py):
a process group of its own, ended with the study's process.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch

from autotune.runners import isolation, trial_process
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.train.config import Limits, Progress, TrialConfig, TrialResult
from autotune.train.ranks import device_of, joined
from autotune.train.tasks import load_task
from autotune.train.trial import run

# Once a rank has failed, how long the others get to report what became of them: the first to
# fail is the cause, and its peers' broken collectives may be read here before it.
FAILURE_SETTLE_SECONDS = 1.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, for one trial's rendezvous: the system picks it, so two
    studies (or two workers) on one machine never pick the same."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]
    except OSError as exc:
        raise TrialFailure(
            f"no port on 127.0.0.1 for the trial's processes to meet on ({exc.strerror or exc})"
        ) from None


def loopback_problem() -> str | None:
    """Why a trial's processes could not meet over TCP on 127.0.0.1 here (no loopback interface
    up, in a network namespace of its own), or None: the ranks would otherwise retry until the
    trial's timeout."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            with socket.create_connection(server.getsockname(), timeout=5):
                return None
    except OSError as exc:
        return exc.strerror or str(exc)


def on_devices(task_name: str, *, study_path: Path, hang_after: float, devices: int) -> RunTrial:
    """Each trial as `devices` ranks in fresh child processes, all killed after `hang_after`
    seconds of wall time."""
    context = isolation.fork_server(task_name)

    def run_trial(
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        port, receivers, ranks, unders = free_port(), [], [], []
        try:
            for rank in range(devices):
                receiver, sender = context.Pipe(duplex=False)
                process = context.Process(
                    target=_rank_main,
                    name=f"autotune-trial-rank-{rank}",
                    args=(
                        sender,
                        os.getpid(),
                        multiprocessing.get_start_method(),
                        task_name,
                        study_path,
                        (rank, devices, port),
                        (config, limits, device_of(device, rank), seed),
                    ),
                )
                process.start()
                sender.close()  # so that the rank's death reads as end-of-file here
                receivers.append(receiver)
                ranks.append(process)
                unders.append(trial_process.watch(process))
            result = _await_ranks(ranks, receivers, hang_after=hang_after, progress=progress)
            for process in ranks:  # done: each leaves the group and exits on its own
                process.join(isolation.EXIT_GRACE_SECONDS)
            return result
        finally:
            for receiver in receivers:
                receiver.close()
            # killed at once where one failed, timed out or was pruned
            for process, under in zip(ranks, unders):
                trial_process.end(process, under)

    return run_trial


def _await_ranks(
    ranks: list[Any], receivers: list[Any], *, hang_after: float, progress: Progress | None
) -> TrialResult:
    """Rank 0's result once every rank has finished; else the cause of the first failure as a
    TrialFailure. A failing rank brings its peers' collectives down with it, and their errors may
    reach here first: once one rank has failed, the others get FAILURE_SETTLE_SECONDS to say
    what happened to them, and the cause is a rank that died without a word, else the earliest
    error."""
    deadline = time.monotonic() + hang_after
    waiting = dict(zip(receivers, range(len(ranks))))
    result: TrialResult | None = None
    failures: dict[int, tuple[float, TrialFailure]] = {}  # rank -> (when, what)
    settled = math.inf  # when the others have had their say, once one failed
    while waiting and time.monotonic() < min(deadline, settled):
        timeout = min(deadline, settled) - time.monotonic()
        for receiver in multiprocessing.connection.wait(list(waiting), min(timeout, 1.0)):
            rank = waiting[receiver]
            try:
                kind, *payload = receiver.recv()
            except (EOFError, ConnectionResetError):  # the rank is gone without a word
                ranks[rank].join()
                description = trial_process.exit_description(ranks[rank].exitcode)
                failures[rank] = (-math.inf, TrialFailure(f"crashed: {description}"))
                kind = "gone"
            if kind == "progress":
                if progress is not None:
                    progress(*payload)
                continue
            if kind == "error":
                failure, when = payload
                failures[rank] = (when, failure)
            elif kind == "result":
                result = payload[0]
            del waiting[receiver]  # "done" too: a rank that has finished
        if failures and settled == math.inf:
            settled = time.monotonic() + FAILURE_SETTLE_SECONDS
    if failures:
        rank, (_, failure) = min(failures.items(), key=lambda found: found[1][0])
        raise _on_rank(failure, rank, len(ranks))
    if waiting:
        raise TrialFailure(
            f"timeout: no result after {hang_after:g} s of wall time; "
            f"the trial's {len(ranks)} processes were killed"
        )
    assert result is not None, "rank 0 sends the result"
    return result


def _on_rank(failure: TrialFailure, rank: int, world_size: int) -> TrialFailure:
    """`failure` with the rank it happened on."""
    where = f"on rank {rank} of {world_size}"
    reason = failure.reason.replace("the trial's process", f"the process of rank {rank}")
    return TrialFailure(f"{reason} ({where})", oom=failure.oom, diverged=failure.diverged)


def _rank_main(
    sender: Any,
    study_pid: int,
    start_method: str,
    task_name: str,
    study_path: Path,
    place: tuple[int, int, int],
    trial: tuple[TrialConfig, Limits, torch.device, int],
) -> None:
    """One rank: build the task, join the group, train; rank 0 sends the result, the others
    "done", a failing rank its failure and when it happened (the earliest is the cause)."""
    trial_process.become_trial_process(study_pid, start_method)
    (rank, world_size, port), (config, limits, device, seed) = place, trial
    try:
        task = load_task(task_name, study_path=study_path)
        with joined(rank, world_size, port=port, device=device) as ranks:
            result = run(
                task,
                config,
                limits=limits,
                device=device,
                seed=seed,
                progress=isolation.reporter(sender) if ranks.main else None,
                ranks=ranks,
            )
    except BaseException as exc:
        sender.send(("error", TrialFailure.of(exc), time.monotonic()))
    else:
        sender.send(("result", result) if rank == 0 else ("done", None))
    finally:
        sender.close()
