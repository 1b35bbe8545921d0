"""A training command on several devices (devices_per_trial): autotune runs it under
torch.distributed's launcher, one process a rank; rank 0's reports count; a rank's fault ends the
whole trial and leaves no process. On the CPU: two ranks joined with gloo."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.cli import main
from autotune.runners.command import command_trial, launched
from autotune.runners.isolation import TrialFailure
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from tests.runners.test_isolation import still_alive

REPO = Path(__file__).resolve().parents[2]
COMMANDS = REPO / "tests" / "commands"
CPU = torch.device("cpu")
BASELINE = TrialConfig.from_mapping(complete(DEFAULT_BASELINE))


def run_ranks(tmp_path: Path, *, max_seconds: float = 60, progress=None, **env: str):
    run_trial = command_trial(
        f"python ranks.py --out {tmp_path}",
        cwd=COMMANDS,
        hang_after=120,
        metric_name="accuracy",
        env={"PYTHONPATH": str(REPO), **env},
        devices=2,
    )
    limits = Limits(target=0.9, max_epochs=3, max_seconds=max_seconds, eval_every=0.25)
    return run_trial(BASELINE, limits=limits, device=CPU, seed=7, progress=progress)


def rank_pids(tmp_path: Path) -> list[int]:
    return [
        int((tmp_path / f"rank-{r}").read_text())
        for r in range(2)
        if (tmp_path / f"rank-{r}").exists()
    ]


def launched_for(out: Path, *, within: float = 20.0) -> list[int]:
    """Live processes whose command line names `out`: the launcher and its ranks of a trial,
    after `within` seconds for them to go, or none once none is left."""
    from tests.runners.test_isolation import alive

    def mentioning() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                named = str(out).encode() in (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if entry.name.isdigit() and named and alive(int(entry.name)):
                found.append(int(entry.name))
        return found

    deadline = time.monotonic() + within
    while mentioning() and time.monotonic() < deadline:
        time.sleep(0.1)
    return mentioning()


# The trial of test_a_rank_that_hangs_in_a_collective_is_killed_with_the_whole_trial, run by a
# process of its own (a process ends every process it did not start itself that was handed to it
# while its trial ran: two trials at once in one process would end each other's). It says when
# rank 0's first report is read, and the trial's outcome.
HANGING = """
import json, sys
from pathlib import Path
from tests.runners.test_command_devices import run_ranks
told = []
def progress(steps, total, metric, seconds, paused):  # called as the clock runs, reports or not
    if metric is not None and not told:
        told.append(metric)
        print("reported", flush=True)
result = run_ranks(Path(sys.argv[1]), max_seconds=8, HANG_RANK="1", progress=progress)
print(json.dumps({"reached": result.reached, "best_metric": result.best_metric}), flush=True)
"""


@pytest.fixture(scope="module")
def hanging_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """That trial, begun before the tests ahead of it in this file: once rank 0 has reported its
    first step, it only waits for its clock's 8 s to pass, and they run meanwhile. Its one figure
    of time, the first report within those 8 s, is in before they begin."""
    out = tmp_path_factory.mktemp("hanging")
    trial = subprocess.Popen(
        [sys.executable, "-c", HANGING, str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = trial.stdout.readline()  # "reported", or "" if it ended first
    try:
        yield out, (first, trial)
    finally:
        if trial.poll() is None:  # a test failed before it waited for it
            trial.kill()
            trial.wait()


def test_one_device_runs_the_command_as_it_is_and_several_under_the_launcher() -> None:
    assert launched(["python", "train.py"], 1) == ["python", "train.py"]
    argv = launched(["/usr/bin/python3", "train.py", "--lr", "0.1"], 4)
    assert argv[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "--no-python",
    ]
    assert argv[6:] == ["/usr/bin/python3", "train.py", "--lr", "0.1"]


@pytest.mark.usefixtures("hanging_rank")  # it waits out its clock while this test runs
def test_two_ranks_train_and_only_rank_0_reports(tmp_path: Path) -> None:
    result = run_ranks(tmp_path)
    assert result.reached and result.best_metric == pytest.approx(1.0)
    # rank 1 reported 0.0 at every step: had its reports counted, the curve would hold them
    assert [point[2] for point in result.curve] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert len(rank_pids(tmp_path)) == 2
    assert still_alive(rank_pids(tmp_path)) == []


@pytest.mark.usefixtures("hanging_rank")  # it waits out its clock while this test runs
def test_out_of_memory_on_one_rank_prunes_the_trial_and_ends_every_rank(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run_ranks(tmp_path, FAIL_RANK="1")
    assert failure.value.oom and "out of memory" in failure.value.reason
    assert "rank failed on purpose" in failure.value.reason
    assert still_alive(rank_pids(tmp_path)) == [] and launched_for(tmp_path) == []


def test_a_rank_that_hangs_in_a_collective_is_killed_with_the_whole_trial(
    hanging_rank: tuple[Path, Any],
) -> None:
    out, (first, trial) = hanging_rank
    rest, err = trial.communicate(timeout=300)
    assert trial.returncode == 0 and first == "reported\n", err
    result = json.loads(rest)
    assert not result["reached"] and result["best_metric"] == pytest.approx(0.2)  # step 1 only
    assert len(rank_pids(out)) == 2
    assert still_alive(rank_pids(out)) == [] and launched_for(out) == []


def test_kill_9_of_the_study_mid_trial_leaves_no_rank_and_the_same_command_finishes(
    tmp_path: Path,
) -> None:
    import contextlib
    import io
    import os
    import signal

    import optuna
    import yaml

    out = tmp_path / "ranks"
    out.mkdir()
    study = {
        "task": {
            "command": f"python {COMMANDS / 'ranks.py'} --out {out}",
            "env": {"PYTHONPATH": str(REPO)},
        },
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {"lr": 0.1, "batch_size": 32, "num_workers": 0, "precision": "fp32"},
        "devices_per_trial": 2,
        "device": "cpu",
        "budget": {"trials": 1, "max_seconds": 60},
        "confirm": {"top": 0},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    command = ["run", str(path), "--quiet"]
    # 1 s steps, from this run's environment (the study's command stays the same): the trial is
    # still running when the study is killed, and each rank hears of it at its next step
    first = subprocess.Popen(
        [sys.executable, "-m", "autotune", *command],
        cwd=REPO,
        env={**os.environ, "STEP_SECONDS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while len(rank_pids(out)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    killed = rank_pids(out)
    assert len(killed) == 2, first.stderr.read().decode() if first.poll() is not None else ""
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert still_alive(killed) == []  # each rank saw the study go and ended its trial
    assert launched_for(out) == []  # and the launcher with them

    for rank in out.iterdir():
        rank.unlink()
    # resumed in this process (no kill awaits it), at the command's own 0.2 s steps
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(command) == 0, err.getvalue()
    trials = optuna.load_study(
        study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}"
    ).get_trials()
    finished = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(finished) == 1 and finished[0].user_attrs["result"]["best_metric"] == 1.0
    assert still_alive(rank_pids(out)) == []
