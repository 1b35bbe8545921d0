"""`autotune run --workers 4` on one study: Optuna's journal file, and a real PostgreSQL server.

Four worker processes on this machine's cores race for an exact budget of 40 trials; every
trial must be run once, by one worker, and the budget met exactly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import yaml

REPO = Path(__file__).resolve().parent.parent
BUDGET, WORKERS = 40, 4


def write_study(folder: Path, storage: str) -> Path:
    study = {
        "task": "tests.tasks:blobs",
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {"lr": {"low": 0.01, "high": 0.3, "log": True}, "batch_size": [16, 32, 64],
                  "num_workers": 0, "precision": "fp32"},
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


def run_workers(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune", "run", str(path), "--workers", str(WORKERS)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def assert_exact_budget(study: optuna.Study, out: str) -> None:
    trials = study.get_trials(deepcopy=False)
    counted = [t for t in trials if not t.user_attrs.get("surplus")]
    surplus = [t for t in trials if t.user_attrs.get("surplus")]
    assert len(counted) == BUDGET, Counter(t.state.name for t in trials)
    assert all(t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) for t in counted)
    assert len({t.number for t in trials}) == len(trials), "trial numbers repeat"
    assert not any("failed_trial" in t.system_attrs for t in trials), "a trial ran twice"
    # Every counted trial trained once, in one worker; the surplus ones (at most one a worker, asked
    # for in the same moment the last slot went) never trained.
    # trained to the end (result), stopped past the incumbent (pruned_at) or out of memory
    assert all("result" in t.user_attrs or "pruned_at" in t.user_attrs or t.user_attrs.get("oom") for t in counted)
    assert len(surplus) < WORKERS and not any("result" in t.user_attrs or "pruned_at" in t.user_attrs for t in surplus)
    workers = Counter(t.user_attrs["worker"] for t in counted)
    assert len(workers) == WORKERS, f"not every worker ran trials: {workers}"
    assert "Winner: " in out


def test_four_workers_on_a_journal_file(tmp_path: Path) -> None:
    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    result = run_workers(path)
    assert result.returncode == 0, result.stderr
    backend = optuna.storages.journal.JournalFileBackend(str(journal))
    study = optuna.load_study(study_name="study", storage=optuna.storages.JournalStorage(backend))
    assert_exact_budget(study, result.stdout)


def test_four_workers_on_a_postgresql_server(tmp_path: Path, postgres_url: str) -> None:
    path = write_study(tmp_path, postgres_url)
    result = run_workers(path)
    assert result.returncode == 0, result.stderr
    assert_exact_budget(optuna.load_study(study_name="study", storage=postgres_url), result.stdout)


def test_a_dead_workers_trial_is_found_by_its_heartbeat_and_run_again(tmp_path: Path, postgres_url: str) -> None:
    """On a database server no lock says who is alive: a killed worker's trial goes stale (no
    heartbeat for the grace period), Optuna fails it and RetryHeartbeatStaleTrialCallback queues it."""
    path = write_study(tmp_path, postgres_url)
    study_file = yaml.safe_load(path.read_text())
    study_file["target"]["value"] = 0.999  # out of reach: every trial trains its full 3 s
    study_file["budget"].update(trials=3, max_epochs=1000, max_seconds=3)
    path.write_text(yaml.safe_dump(study_file))
    env = {**os.environ, "AUTOTUNE_HEARTBEAT": "1,3"}  # beat every second, stale after 3
    command = [sys.executable, "-m", "autotune", "run", str(path)]
    worker = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, running = time.monotonic() + 120, []
    while time.monotonic() < deadline and not running:
        time.sleep(0.3)
        with contextlib.suppress(KeyError):
            study = optuna.load_study(study_name="study", storage=postgres_url)
            running = [t.number for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))]
    assert running, "no trial started"
    time.sleep(1.5)  # a heartbeat or two
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(4)  # past the grace period

    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="study", storage=postgres_url).get_trials()
    stale = trials[running[0]]
    assert stale.state == optuna.trial.TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == stale.params
    counted = [t for t in trials if t.state.is_finished() and t.number != stale.number]
    assert len(counted) == 3 and not [t for t in trials if not t.state.is_finished()]


def test_sigterm_stops_every_worker_and_the_same_command_finishes(tmp_path: Path) -> None:
    journal = tmp_path / "study.journal"
    path = write_study(tmp_path, f"journal:///{journal}")
    command = [sys.executable, "-m", "autotune", "run", str(path), "--workers", "2"]
    parent = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
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
    assert len(trials) < BUDGET and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]

    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    trials = optuna.load_study(study_name="study", storage=storage).get_trials()
    counted = [t for t in trials if t.state.is_finished() and not t.user_attrs.get("surplus")
               and not t.user_attrs.get("interrupted")]
    assert len(counted) == BUDGET


def test_systems_only_under_workers_tells_each_measured_setting_once(tmp_path: Path) -> None:
    """With two workers, the baseline's maths trains once and each other setting is told once; and a
    study holding only the trained trial (as a run stopped just after it trained leaves it) is told
    the rest when the same command runs again."""
    from autotune.study import schema

    def journal_study(journal: Path) -> optuna.Study:
        backend = optuna.storages.journal.JournalFileBackend(str(journal))
        return optuna.load_study(study_name="study", storage=optuna.storages.JournalStorage(backend))

    def timed_splits(trials: list) -> tuple[list, Counter]:
        timed = [t for t in trials if schema.prediction(t) is not None]
        trained = [t for t in timed if "from_trial" not in schema.prediction(t)]
        return trained, Counter((schema.config(t)["batch_size"], schema.config(t)["accumulation_steps"]) for t in timed)

    path = write_study(tmp_path, f"journal:///{tmp_path / 'first.journal'}")
    study = yaml.safe_load(path.read_text())
    study.update(objective="systems_only", probe="none", baseline={"lr": 0.1, "batch_size": 32, "accumulation_steps": 2})
    study["space"]["accumulation_steps"] = [1, 2, 4]
    path.write_text(yaml.safe_dump(study))
    result = subprocess.run([sys.executable, "-m", "autotune", "run", str(path), "--workers", "2"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    first = journal_study(tmp_path / "first.journal")
    trained, splits = timed_splits(first.get_trials())
    assert len(trained) == 1 and splits == {(16, 4): 1, (32, 2): 1, (64, 1): 1}, splits

    resumed = tmp_path / "resumed.journal"
    backend = optuna.storages.journal.JournalFileBackend(str(resumed))
    copy = optuna.create_study(study_name="study", storage=optuna.storages.JournalStorage(backend),
                               directions=first.directions)
    for name, value in first.user_attrs.items():
        copy.set_user_attr(name, value)
    for name, value in first._storage.get_study_system_attrs(first._study_id).items():
        copy._storage.set_study_system_attr(copy._study_id, name, value)
    copy.add_trial(trained[0])
    study["storage"] = f"journal:///{resumed}"
    path.write_text(yaml.safe_dump(study))
    result = subprocess.run([sys.executable, "-m", "autotune", "run", str(path), "--workers", "2"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    trained, splits = timed_splits(journal_study(resumed).get_trials())
    assert len(trained) == 1 and splits == {(16, 4): 1, (32, 2): 1, (64, 1): 1}, splits
    assert "Winner: " in result.stdout
