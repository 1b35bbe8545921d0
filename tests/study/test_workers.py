"""`autotune run --workers K` on one study: Optuna's journal file, and a real PostgreSQL server.

Up to four worker processes, one a core (autotune starts no more), race for an exact budget of
40 trials; every trial must be run once, by one worker, and the budget met exactly.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BUDGET, WORKERS = 40, min(4, len(os.sched_getaffinity(0)))
# Trials of a few hundred milliseconds for the races in which every worker must run some: blobs'
# take about ten, and under load one worker once took all 40 before the other imported torch.
RACED_TASK = "tests.tasks:steady_blobs"


def write_study(folder: Path, storage: str, *, task: str = "tests.tasks:blobs") -> Path:
    study = {
        "task": task,
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {
            "lr": {"low": 0.01, "high": 0.3, "log": True},
            "batch_size": [16, 32, 64],
            "num_workers": 0,
            "precision": "fp32",
        },
        "budget": {"trials": BUDGET, "max_epochs": 2, "max_seconds": 5, "eval_every": 0.5},
        "confirm": {"top": 1, "runs": 1},
        "storage": storage,
        # Every trial trains to the end: trials cut short past the incumbent take milliseconds, and
        # the first workers up would take the whole budget before the others had imported torch.
        "prune": "none",
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports, here and in the workers


def here(capfd: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` run by this process, where no signal or kill awaits the run: no start-up
    (torch's import) to pay before its workers, which are still processes of their own. Read from
    the file descriptors, their output is in the result too."""
    from autotune.cli import main

    capfd.readouterr()
    code = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["autotune", *args], code, out, err)


def run_workers(path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(path), "--workers", str(WORKERS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_exact_budget(study: optuna.Study, out: str) -> None:
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if not t.user_attrs.get("surplus")]
    surplus = [t for t in trials if t.user_attrs.get("surplus")]
    assert len(counted) == BUDGET, Counter(t.state.name for t in trials)
    assert all(
        t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        for t in counted
    )
    assert len({t.number for t in trials}) == len(trials), "trial numbers repeat"
    assert not any("failed_trial" in t.system_attrs for t in trials), "a trial ran twice"
    # Every counted trial trained once, in one worker; the surplus ones (at most one a worker, asked
    # for in the same moment the last slot went) never trained.
    # trained to the end (result), stopped past the incumbent (pruned_at) or out of memory
    assert all(
        "result" in t.user_attrs or "pruned_at" in t.user_attrs or t.user_attrs.get("oom")
        for t in counted
    )
    assert len(surplus) < WORKERS and not any(
        "result" in t.user_attrs or "pruned_at" in t.user_attrs for t in surplus
    )
    workers = Counter(t.user_attrs["worker"] for t in counted)
    assert len(workers) == WORKERS, f"not every worker ran trials: {workers}"
    assert "Winner: " in out


def test_workers_on_a_journal_file_each_with_gpus_of_their_own(tmp_path: Path) -> None:
    """The exact budget on a journal file; and on a machine of two GPUs a worker (simulated:
    AUTOTUNE_SIMULATED_GPUS), each worker is given two of its own through CUDA_VISIBLE_DEVICES:
    no two trials running at the same time share one, and the report shows where each ran."""
    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}", task=RACED_TASK)
    # One study for both readings: the simulated GPUs change nothing else (the trials still train
    # on the CPU), and the race of 40 trials lets every worker run some.
    result = run_workers(path, env={**os.environ, "AUTOTUNE_SIMULATED_GPUS": str(2 * WORKERS)})
    assert result.returncode == 0, result.stderr
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name="study", storage=optuna.storages.JournalStorage(backend))
    assert_exact_budget(study, result.stdout)
    assert not (
        tmp_path / "study.journal.runner.lock"
    ).exists()  # the run and its workers are over: nothing beside it
    assert "[I " not in result.stderr, result.stderr  # autotune speaks for Optuna's INFO logs

    ran = [t for t in study.get_trials() if "result" in t.user_attrs or "pruned_at" in t.user_attrs]
    shares = {tuple(t.user_attrs["devices"]) for t in ran}
    assert shares == {(str(2 * i), str(2 * i + 1)) for i in range(WORKERS)}, shares
    for one in ran:
        for other in ran:
            at_once = (
                one.number != other.number
                and one.datetime_start < other.datetime_complete
                and other.datetime_start < one.datetime_complete
            )
            assert not (at_once and one.user_attrs["devices"] == other.user_attrs["devices"])
    assert "devices" in result.stdout and ("0,1" in result.stdout or "2,3" in result.stdout)


def test_a_timeout_under_workers_is_said_once_with_the_figure_given(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each worker is given what is left of the timeout; the run says it was reached once, as
    the user gave it, and only when the budget is not done."""
    path = write_study(tmp_path, f"journal:///{tmp_path / 'study.journal'}")
    study_file = yaml.safe_load(path.read_text())
    study_file["target"]["value"] = 0.999  # out of reach: every trial trains its full 1 s
    study_file["budget"].update(trials=10, max_epochs=1000, max_seconds=1)
    # Neither is what this checks: the probe would spend the timeout before the workers start,
    # the confirmation train on after it.
    study_file.update(probe="none", confirm={"top": 0})
    path.write_text(yaml.safe_dump(study_file))
    result = here(capfd, "run", str(path), "--workers", "2", "--timeout", "5")
    assert result.returncode == 0, result.stderr
    assert "(2 workers)" in result.stderr, result.stderr  # the workers ran, each with less than 5 s
    assert result.stderr.count("timeout of") == 1, result.stderr
    assert re.search(r"timeout of 5 s reached with \d of 10 trials finished", result.stderr)


def test_workers_on_a_postgresql_server(
    tmp_path: Path, postgres_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, postgres_url, task=RACED_TASK)
    result = here(capfd, "run", str(path), "--workers", str(WORKERS))
    assert result.returncode == 0, result.stderr
    assert_exact_budget(optuna.load_study(study_name="study", storage=postgres_url), result.stdout)


def test_a_dead_workers_trial_is_found_by_its_heartbeat_and_run_again(
    tmp_path: Path, postgres_url: str
) -> None:
    """On a database server no lock says who is alive: a killed worker's trial goes stale (no
    heartbeat for the grace period), Optuna fails it and RetryHeartbeatStaleTrialCallback queues
    it."""
    path = write_study(tmp_path, postgres_url)
    study_file = yaml.safe_load(path.read_text())
    study_file["target"]["value"] = 0.999  # out of reach: every trial trains its full 3 s
    # One trial: the stale one, whose retry alone then meets the budget (were the stale trial
    # counted, the budget would be met without it and the retry would not run).
    study_file["budget"].update(trials=1, max_epochs=1000, max_seconds=3)
    study_file.update(probe="none", confirm={"top": 0})  # neither is what this checks
    path.write_text(yaml.safe_dump(study_file))
    env = {**os.environ, "AUTOTUNE_HEARTBEAT": "1,2"}  # beat every second, stale after 2
    command = [sys.executable, "-m", "autotune", "run", str(path)]
    worker = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline, running = time.monotonic() + 120, []
    while time.monotonic() < deadline and not running:
        time.sleep(0.3)
        with contextlib.suppress(KeyError):
            study = optuna.load_study(study_name="study", storage=postgres_url)
            running = [
                t.number for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
            ]
    assert running, "no trial started"
    time.sleep(1.5)  # a heartbeat or two
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(3)  # past the grace period

    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="study", storage=postgres_url).get_trials()
    stale = trials[running[0]]
    assert stale.state == optuna.trial.TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == stale.params
    counted = [t for t in trials if t.state.is_finished() and t.number != stale.number]
    assert len(counted) == 1 and not [t for t in trials if not t.state.is_finished()]


def test_sigterm_stops_every_worker_and_the_same_command_finishes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "study.journal"
    # under load the two workers once took blobs' whole budget between two looks at the storage,
    # before the signal was sent
    path = write_study(tmp_path, f"journal:///{journal}", task=RACED_TASK)
    # 16 trials, not 40: the signal goes once 4 exist, and the same command then trains the rest
    study_file = yaml.safe_load(path.read_text())
    study_file["budget"]["trials"] = budget = 16
    study_file.update(probe="none", confirm={"top": 0})  # neither is what this checks
    path.write_text(yaml.safe_dump(study_file))
    command = [sys.executable, "-m", "autotune", "run", str(path), "--workers", "2"]
    parent = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(journal))
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.3)
        with contextlib.suppress(KeyError):
            if len(optuna.load_study(study_name="study", storage=storage).get_trials()) >= 4:
                break
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=120)

    assert parent.returncode == 143, err
    assert err.strip().splitlines()[-1] == f"Resume with: autotune run {path} --workers 2"
    trials = optuna.load_study(study_name="study", storage=storage).get_trials()
    assert len(trials) < budget and not [
        t for t in trials if t.state == optuna.trial.TrialState.RUNNING
    ]

    result = here(capfd, *command[3:])  # the same command, in this process: no signal awaits it
    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="study", storage=storage).get_trials()
    counted = [
        t
        for t in trials
        if t.state.is_finished()
        and not t.user_attrs.get("surplus")
        and not t.user_attrs.get("interrupted")
    ]
    assert len(counted) == budget


def test_systems_only_under_workers_tells_each_measured_setting_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """With two workers, the baseline's maths trains once and each other setting is told once; and a
    study holding only the trained trial (as a run stopped just after it trained leaves it) is told
    the rest when the same command runs again."""
    from autotune.record import schema

    def journal_study(journal: Path) -> optuna.Study:
        backend = optuna.storages.journal.JournalFileBackend(str(journal))
        return optuna.load_study(
            study_name="study", storage=optuna.storages.JournalStorage(backend)
        )

    def timed_splits(trials: list) -> tuple[list, Counter]:
        timed = [t for t in trials if schema.prediction(t) is not None]
        trained = [t for t in timed if "from_trial" not in schema.prediction(t)]
        return trained, Counter(
            (schema.trained_config(t)["batch_size"], schema.trained_config(t)["accumulation_steps"])
            for t in timed
        )

    path = write_study(tmp_path, f"journal:///{tmp_path / 'first.journal'}")
    study = yaml.safe_load(path.read_text())
    study.update(
        objective="systems_only",
        baseline={"lr": 0.1, "batch_size": 32, "accumulation_steps": 2},
    )
    # one setting per split
    study["space"].update(accumulation_steps=[1, 2, 4], fused_optimizer=False)
    path.write_text(yaml.safe_dump(study))
    result = here(capfd, "run", str(path), "--workers", "2")
    assert result.returncode == 0, result.stderr
    first = journal_study(tmp_path / "first.journal")
    trained, splits = timed_splits(first.get_trials())
    assert len(trained) == 1 and splits == {(16, 4): 1, (32, 2): 1, (64, 1): 1}, splits

    resumed = tmp_path / "resumed.journal"
    backend = optuna.storages.journal.JournalFileBackend(str(resumed))
    copy = optuna.create_study(
        study_name="study",
        storage=optuna.storages.JournalStorage(backend),
        directions=first.directions,
    )
    for name, value in first.user_attrs.items():
        copy.set_user_attr(name, value)
    for name, value in first._storage.get_study_system_attrs(first._study_id).items():
        copy._storage.set_study_system_attr(copy._study_id, name, value)
    copy.add_trial(trained[0])
    study["storage"] = f"journal:///{resumed}"
    path.write_text(yaml.safe_dump(study))
    result = here(capfd, "run", str(path), "--workers", "2")
    assert result.returncode == 0, result.stderr
    trained, splits = timed_splits(journal_study(resumed).get_trials())
    assert len(trained) == 1 and splits == {(16, 4): 1, (32, 2): 1, (64, 1): 1}, splits
    assert "Winner: " in result.stdout


def journal_study(journal: Path) -> optuna.Study:
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    return optuna.load_study(study_name="study", storage=optuna.storages.JournalStorage(backend))


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_die_with_their_parent_and_the_same_command_finishes_the_budget(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`kill -9` of `autotune run --workers 2`: its workers do not train on as orphans; each marks
    its own trial interrupted and exits, and the same command, run at once, meets the budget."""
    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    study_file = yaml.safe_load(path.read_text())
    study_file["target"]["value"] = 0.999  # out of reach: every trial trains its full 3 s
    # 4 trials of 3 s for 2 workers: both train at once unless one starts 9 s after the other
    study_file["budget"].update(trials=4, max_epochs=1000, max_seconds=3)
    study_file.update(probe="none", confirm={"top": 0})  # neither is what this checks
    path.write_text(yaml.safe_dump(study_file))
    command = [sys.executable, "-m", "autotune", "run", str(path), "--workers", "2", "--quiet"]
    parent = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline, running = time.monotonic() + 120, []
    while len(running) < 2:
        assert parent.poll() is None and time.monotonic() < deadline, "the workers never trained"
        time.sleep(0.3)
        with contextlib.suppress(KeyError, ValueError):
            running = journal_study(journal).get_trials(states=(optuna.trial.TrialState.RUNNING,))
    workers = children_of(parent.pid)
    assert len(workers) == 2
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, "a worker outlived its parent by 10 s"
        time.sleep(0.1)

    trials = journal_study(journal).get_trials()
    stopped = [t for t in trials if t.number in {r.number for r in running}]
    assert all(
        t.state == optuna.trial.TrialState.FAIL
        and t.user_attrs["reason"] == "interrupted: stopped by SIGTERM"
        for t in stopped
    ), [(t.state, t.user_attrs.get("reason")) for t in stopped]
    result = here(capfd, *command[3:])  # the same command, in this process: no kill awaits it
    assert result.returncode == 0, result.stderr
    trials = journal_study(journal).get_trials()
    counted = [
        t
        for t in trials
        if t.state.is_finished()
        and not t.user_attrs.get("surplus")
        and not t.user_attrs.get("interrupted")
    ]
    assert len(counted) == 4 and not [
        t for t in trials if t.state == optuna.trial.TrialState.RUNNING
    ]


def test_a_run_waits_for_the_workers_of_a_stopped_run_before_it_recovers_their_trials(
    tmp_path: Path,
) -> None:
    """While a worker of an earlier run still holds its share of the runner lock (as one does for
    the moment it takes to mark its trial), the next run waits and touches nothing; once it lets
    go, the run goes on."""
    import fcntl

    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    study_file = yaml.safe_load(path.read_text())
    study_file["budget"]["trials"] = 1
    path.write_text(yaml.safe_dump(study_file))
    waiting = "waiting for the workers of an earlier, stopped run to mark their trials and exit"
    err_file = tmp_path / "run.err"
    with open(tmp_path / "study.journal.runner.lock", "a+") as lock, open(err_file, "w") as err:
        # the workers' byte, as runner_lock.as_worker takes it
        fcntl.lockf(lock, fcntl.LOCK_SH, 1, 1)
        run = subprocess.Popen(
            [sys.executable, "-m", "autotune", "run", str(path), "--quiet"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        # Once it says it waits (it gives up only after runner_lock.WORKERS_GONE_SECONDS), it
        # must still wait a while later, with nothing touched.
        deadline = time.monotonic() + 120
        while waiting not in err_file.read_text():
            assert run.poll() is None and time.monotonic() < deadline, err_file.read_text()
            time.sleep(0.1)
        time.sleep(2)
        assert run.poll() is None and not journal.exists()
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, err_file.read_text()
    assert "Winner: " in out or "baseline" in out


def test_more_workers_than_the_budget_or_the_cores_can_use_are_not_started(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    study_file = yaml.safe_load(path.read_text())
    study_file["budget"]["trials"] = 2
    path.write_text(yaml.safe_dump(study_file))
    result = here(capfd, "run", str(path), "--workers", "500", "--quiet")
    assert result.returncode == 0, result.stderr
    usable = min(2, len(os.sched_getaffinity(0)))
    assert (
        "autotune: --workers 500 is more than can be used (the budget has 2 trial(s), "
        "this process may use "
        f"{len(os.sched_getaffinity(0))} CPU core(s)); starting {usable}"
    ) in result.stderr
    trials = journal_study(journal).get_trials()
    assert len({t.user_attrs["worker"] for t in trials if "worker" in t.user_attrs}) <= usable


@pytest.mark.parametrize(
    "gpus, per_trial, needs",
    [("1", 1, "needs 2 GPUs"), ("3", 2, "needs 4 GPUs")],
)
def test_more_workers_than_the_gpus_take_is_an_error_before_the_storage(
    tmp_path: Path,
    gpus: str,
    per_trial: int,
    needs: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autotune.cli import main

    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    study_file = yaml.safe_load(path.read_text())
    study_file["devices_per_trial"] = per_trial
    path.write_text(yaml.safe_dump(study_file))
    # In this process: an error before any worker or storage needs no process of its own.
    monkeypatch.setenv("AUTOTUNE_SIMULATED_GPUS", gpus)
    monkeypatch.chdir(REPO)
    code = main(["run", str(path), "--workers", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    message = err.strip()
    assert message.startswith(f"autotune: error: {path}: --workers 2 with devices_per_trial")
    assert needs in message and "Traceback" not in err
    assert not journal.exists()


def test_each_worker_gets_an_equal_share_of_the_gpus() -> None:
    from autotune.study import workers

    spec = type("Spec", (), {"devices_per_trial": 2, "path": Path("s.yaml")})()
    ids = [str(i) for i in range(8)]
    assert workers.gpu_shares(spec, 4, ids) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert workers.gpu_shares(spec, 3, ids) == [["0", "1"], ["2", "3"], ["4", "5"]]
    assert workers.gpu_shares(spec, 2, []) == [[], []]  # a CPU study: no GPU to give
