"""A trial on two devices (CPU, gloo) when one rank fails: out of memory on rank 1 only prunes the
trial with rank 1's reason, a rank that exits ends the trial at once, a rank that hangs (its peer
waiting on it in a collective) is killed with the whole trial at its timeout; a trial the study
prunes and one whose loss turns NaN stop as on one device; and a study killed with SIGKILL
mid-trial leaves no rank behind and resumes at once. No process is left in any case."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.cli import main
from autotune.runners import distributed
from autotune.runners.isolation import Pruned, TrialFailure
from autotune.train.config import Limits, TrialConfig
from tests.runners.test_isolation import alive, children, still_alive

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
LIMITS = Limits(target=0.9, max_epochs=4, max_seconds=60, eval_every=0.5)
CONFIG = TrialConfig(
    lr=0.1,
    scheduler="constant",
    batch_size=32,
    accumulation_steps=2,
    num_workers=0,
    prefetch_factor=None,
    pin_memory=False,
    precision="fp32",
)


def two_device_trial(task: str, *, hang_after: float) -> tuple[TrialFailure, float, list[int]]:
    return two_device_trial_of(task, CONFIG, hang_after=hang_after)


def two_device_trial_of(
    task: str, config: TrialConfig, *, hang_after: float
) -> tuple[TrialFailure, float, list[int]]:
    """Run one trial of `task` on 2 ranks, which must fail: the failure, the seconds it took and
    the processes left under the fork server the ranks came from."""
    run_trial = distributed.on_devices(
        f"tests.tasks:{task}", study_path=REPO / "study.yaml", hang_after=hang_after, devices=2
    )
    started = time.monotonic()
    with pytest.raises(TrialFailure) as failed:
        run_trial(config, limits=LIMITS, device=CPU, seed=1)
    took = time.monotonic() - started
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    return failed.value, took, [p for p in children(server) if alive(p)]


def test_a_trial_on_two_devices_trains_to_its_target_and_leaves_no_rank() -> None:
    run_trial = distributed.on_devices(
        "tests.tasks:blobs", study_path=REPO / "study.yaml", hang_after=120, devices=2
    )
    reports = []
    result = run_trial(
        CONFIG, limits=LIMITS, device=CPU, seed=1, progress=lambda *seen: reports.append(seen)
    )
    assert result.reached and result.stop_reason == "target"
    # samples over both ranks: 2 ranks x 32 x 2 a step
    assert result.epochs == result.optimizer_steps * 128 / 1024
    assert reports and reports[-1][0] >= 1  # rank 0 reported its progress
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert not still_alive(children(server), within=10)


def test_out_of_memory_on_rank_one_fails_the_trial_as_out_of_memory_with_rank_one_s_reason() -> (
    None
):
    failure, _, left = two_device_trial("oom_on_rank_one", hang_after=120)
    assert failure.oom
    assert failure.reason == (
        "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB "
        "(on rank 1 of 2)"
    )
    assert left == []


def test_a_rank_that_exits_ends_the_trial_at_once_not_at_its_timeout() -> None:
    failure, took, left = two_device_trial("exits_on_rank_one", hang_after=300)
    assert failure.reason == (
        "crashed: the process of rank 1 exited with status 3 before it reported a result "
        "(on rank 1 of 2)"
    )
    assert took < 60  # rank 0, waiting on rank 1 in the all-reduce, was not left to the timeout
    assert left == []


def test_a_rank_that_hangs_is_killed_with_the_whole_trial_at_its_timeout() -> None:
    # 2 s: what the hang must wait out; the ranks need not even have met for the check to hold
    failure, took, left = two_device_trial("hangs_on_rank_one", hang_after=2)
    assert failure.reason.startswith("timeout: no result after 2 s of wall time")
    assert not failure.oom
    assert took >= 2
    assert left == []


def test_a_trial_the_study_prunes_stops_on_every_rank() -> None:
    """The study's progress callback stops it (prune: incumbent) as it stops a child's."""
    run_trial = distributed.on_devices(
        "tests.tasks:slow_blobs", study_path=REPO / "study.yaml", hang_after=120, devices=2
    )

    def past_the_incumbent(
        steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        raise Pruned("pruned: past the best time so far", seconds=seconds, paused=paused)

    with pytest.raises(Pruned, match="past the best time"):
        run_trial(CONFIG, limits=LIMITS, device=CPU, seed=1, progress=past_the_incumbent)
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    assert [p for p in children(server) if alive(p)] == []


def test_a_loss_that_becomes_nan_ends_the_trial_as_diverged() -> None:
    failure, _, left = two_device_trial_of(
        "blobs", dataclasses.replace(CONFIG, lr=1e6), hang_after=120
    )
    assert failure.diverged and failure.reason.startswith("diverged: loss became")
    assert left == []


def write_study(tmp_path: Path, task: str, *, confirm: int = 1, **budget: float) -> Path:
    study = {
        "name": "study",
        "task": f"tests.tasks:{task}",
        "target": {"metric": "accuracy", "value": 0.9},
        "devices_per_trial": 2,
        "space": {
            "lr": {"low": 0.05, "high": 0.3, "log": True},
            "scheduler": "constant",
            "batch_size": [16, 32],
            "accumulation_steps": [1, 2],
            "data_on_device": False,  # the loader fixed: nothing for a probe to settle
            "num_workers": 0,
            "precision": "fp32",
        },
        "budget": {"max_epochs": 4, "max_seconds": 30, "eval_every": 0.5, **budget},
        "confirm": {"top": confirm, "runs": 1},
        "seed": 0,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def autotune(*args: str, **popen: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
        **popen,
    )


def stored(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    return optuna.load_study(study_name="study", storage=storage).get_trials()


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for parent in frontier for c in children(parent)]
        found += frontier
    return found


def test_a_study_on_two_devices_prunes_rank_one_s_out_of_memory(tmp_path: Path) -> None:
    # no confirmation: a pruned trial has none to run
    path = write_study(tmp_path, "oom_on_rank_one", trials=1, confirm=0)
    run = autotune("run", str(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: set[int] = set()
    while run.poll() is None:  # every process under the study, as they come and go
        seen.update(descendants(run.pid))
        time.sleep(0.1)
    _, err = run.communicate()
    assert run.returncode == 0, err
    trials = stored(tmp_path)
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED]
    assert trials[0].user_attrs["oom"] is True
    assert trials[0].user_attrs["reason"] == (
        "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB "
        "(on rank 1 of 2)"
    )
    assert not still_alive(sorted(seen)), "processes outlived the study"


def test_kill_9_mid_trial_then_the_same_command_resumes_with_nothing_left(tmp_path: Path) -> None:
    path = write_study(tmp_path, "slow_blobs", trials=1, confirm=0)
    first = autotune("run", str(path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, ranks = time.monotonic() + 120, []
    while time.monotonic() < deadline and len(ranks) < 2:  # the fork server, under it 2 ranks
        ranks = [rank for server in children(first.pid) for rank in children(server)]
        time.sleep(0.1)
    assert len(ranks) == 2, "no trial on 2 devices started"
    time.sleep(1.0)  # into the trial's training
    assert all(alive(rank) for rank in ranks)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert not still_alive(ranks), "a rank outlived the study it trained for"
    # resumed in this process: nothing kills it, and the fork server is there already
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["run", str(path)]) == 0, err.getvalue()
    out = out.getvalue()
    trials = stored(tmp_path)
    interrupted = [t for t in trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state == optuna.trial.TrialState.FAIL
    finished = [t for t in trials if not t.user_attrs.get("interrupted")]
    assert [t.state for t in finished] == [optuna.trial.TrialState.COMPLETE]
    assert finished[0].params == interrupted[0].params  # the interrupted configuration, again
    assert "Winner: " in out
