"""End to end: `autotune run | report | export` on small real studies, resume, OOM, kill, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.record import schema
from autotune.search.knob import DDP_NAMES
from autotune.search.space import KNOBS
from autotune.spec.study_file import load as load_spec
from tests import tasks

REPO = Path(__file__).resolve().parents[2]


def write_study(
    tmp_path: Path,
    *,
    task: str = "tests.tasks:blobs",
    trials: int = 4,
    batch_sizes=(16, 32, 64),
    seed: int = 0,
    confirm: dict | None = None,
    params: dict | None = None,
    first_trial: str | None = None,
) -> Path:
    study = {
        "task": task,
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {
            "lr": {"low": 0.01, "high": 0.3, "log": True},
            "scheduler": ["constant", "cosine"],
            "batch_size": list(batch_sizes),
            "accumulation_steps": [1, 2],
            "data_on_device": False,
            "num_workers": 0,
            "precision": "fp32",
        },
        "budget": {"trials": trials, "max_epochs": 4, "max_seconds": 10, "eval_every": 0.5},
        "confirm": confirm if confirm is not None else {"top": 2, "runs": 2},
        "seed": seed,
    }
    if params is not None:
        study["space"]["params"] = params
    if first_trial is not None:
        study["first_trial"] = first_trial
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def load(path: Path) -> optuna.Study:
    return optuna.load_study(study_name="study", storage=f"sqlite:///{path.with_suffix('.db')}")


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in study.get_trials()
        if t.state.is_finished() and not t.user_attrs.get("interrupted")
    ]


def run_cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports


def test_run_then_more_trials_keeps_every_earlier_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # one confirmation run each (the verdict's sentence is there whatever the runs)
    path = write_study(tmp_path, trials=3, confirm={"top": 1, "runs": 1})
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    assert code == 0 and "Winner: " in out and ("x faster" in out or "keep the baseline" in out)
    first = {t.number: (t.params, t.value, t.state) for t in finished(load(path))}
    assert len(first) == 3

    code, _, _ = run_cli("run", str(path), "--trials", "5", capsys=capsys)
    assert code == 0
    after = {t.number: (t.params, t.value, t.state) for t in finished(load(path))}
    assert len(after) == 5
    assert {n: after[n] for n in first} == first


def test_running_a_finished_study_again_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, trials=2, confirm={"top": 1, "runs": 1})
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    before = load(path)
    stored = before.user_attrs["confirmation"]
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    again = load(path)
    assert code == 0 and "Winner" in out
    assert len(again.get_trials()) == len(before.get_trials()) == 2
    assert again.user_attrs["confirmation"] == stored  # not re-measured
    # recorded when the study began
    assert again.user_attrs[schema.VERSION] == schema.SCHEMA_VERSION


def test_timeout_stops_starting_trials_and_says_how_to_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, trials=500, confirm={"top": 0, "runs": 0})
    code, out, err = run_cli("run", str(path), "--timeout", "0.5", capsys=capsys)
    done = len(finished(load(path)))
    assert code == 0 and done < 500 and "Study study:" in out
    assert f"with {done} of 500 trials finished; run the same command again" in err


def test_the_timeout_counts_from_the_runs_start_the_probe_included(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """budget.timeout is the run's: a probe that outlasts it leaves no time to start a trial, and
    what it measured is kept for the next run."""
    path = write_study(
        tmp_path, task="tests.tasks:paced_quick", batch_sizes=(64,), confirm={"top": 0}
    )
    study = yaml.safe_load(path.read_text())
    study["space"].update(
        lr=0.1, scheduler="constant", num_workers=[0, 2], prefetch_factor=2, fused_optimizer=False
    )
    study["probe"] = "joint"  # its measurements take over a second each on the paced task
    path.write_text(yaml.safe_dump(study))
    code, _, err = run_cli("run", str(path), "--timeout", "1", capsys=capsys)
    stored = load(path)
    assert code == 0 and schema.probe(stored.user_attrs) is not None
    # none started (the prior's first trial is queued for the next run)
    waiting = optuna.trial.TrialState.WAITING
    assert all(t.state == waiting for t in stored.get_trials())
    assert "timeout of 1 s reached with 0 of 4 trials finished" in err


def test_report_json_and_exports_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_study(tmp_path, trials=3)
    started = time.monotonic()
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    wall = time.monotonic() - started
    code, out, _ = run_cli("report", str(path), "--json", capsys=capsys)
    assert code == 0
    summary = json.loads(out)
    # where the run's time went: its parts, within the run's wall time
    spent = summary["time_spent"]
    parts = [spent[k] for k in ("probe", "throughput_table", "trials", "confirmation")]
    assert spent["trial_count"] == 3 and spent["trials"] >= spent["training"] > 0
    assert spent["confirmation"] > 0 and spent["total"] == pytest.approx(
        sum(p for p in parts if p is not None)
    )
    assert spent["total"] <= wall
    # the trials' evaluations told apart from their training and the rest, pruned ones' too
    assert spent["evaluating"] > 0 and spent["trials"] > spent["training"] + spent["evaluating"]
    stopped = [t for t in load(path).get_trials() if "pruned_at" in t.user_attrs]
    assert all(t.user_attrs["paused_at"] >= 0 for t in stopped)
    best = summary["best"]
    assert set(best["params"]) == set(KNOBS) - set(DDP_NAMES)  # one device: no DDP
    assert best["time_to_target"] > 0 and best["metric"] >= 0.9 and best["source"] == "confirmed"
    assert best["runs"] == 2 and summary["baseline"]["runs"] == 2 and summary["speedup"] > 0
    assert {"complete", "pruned", "failed", "oom"} <= set(summary["counts"])
    counts = summary["counts"]
    # pruned: past the incumbent
    assert counts["complete"] >= 1 and counts["complete"] + counts["pruned"] == 3

    code, out, _ = run_cli("export", str(path), "--format", "json", capsys=capsys)
    assert code == 0 and json.loads(out) == best["params"]

    # telemetry: stored on every trial that trained to its end, and the winner's in the summary
    for trial in load(path).get_trials():
        if trial.state == optuna.trial.TrialState.COMPLETE:
            result = trial.user_attrs["result"]
            # throughput is None when the target came before a step past warm-up
            assert (
                0 <= result["input_wait_fraction"] <= 1 and (result["samples_per_second"] or 1) > 0
            )
            # no NVIDIA GPU: absent
            assert result["peak_memory_bytes"] > 0 and result["gpu"] is None
    figures = best["telemetry"]
    assert (
        figures["source"] == "confirmation"
        and figures["runs"] == 2
        and figures["samples_per_second"] > 0
    )
    per_class = best["per_class"]
    assert [c["class"] for c in per_class["classes"]] == [0, 1, 2, 3]
    # two runs over the validation set
    assert sum(c["support"] for c in per_class["classes"]) == 2 * 512
    target = tmp_path / "best.yaml"
    assert (
        run_cli("export", str(path), "--format", "yaml", "-o", str(target), capsys=capsys)[0] == 0
    )
    assert yaml.safe_load(target.read_text()) == best["params"]


def test_params_are_tuned_stored_reported_and_confirmed_like_the_knobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's own parameters are sampled, reach the task, and come back in every output."""
    params = {
        "width": {"low": 8, "high": 48},
        "dropout": {"low": 0.0, "high": 0.3},
        "weight_decay": {"low": 1e-5, "high": 1e-3, "log": True},
        "kind": ["sgd", "adamw"],
    }
    path = write_study(
        tmp_path, task="tests.tasks:tunable", trials=4, params=params, confirm={"top": 1, "runs": 1}
    )
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    assert code == 0, out
    trials = finished(load(path))
    assert len(trials) == 4
    for t in trials:
        assert isinstance(t.params["width"], int) and 8 <= t.params["width"] <= 48
        assert 1e-5 <= t.params["weight_decay"] <= 1e-3 and t.params["kind"] in ("sgd", "adamw")
        assert {k: t.user_attrs["config"][k] for k in params} == {k: t.params[k] for k in params}
    assert len({t.params["width"] for t in trials}) > 1  # sampled, not fixed
    assert "width" in out and "weight_decay" in out  # in the table and the winner's settings

    summary = json.loads(run_cli("report", str(path), "--json", capsys=capsys)[1])
    best, baseline = summary["best"], summary["baseline"]
    one_device = [k for k in KNOBS if k not in DDP_NAMES]  # DDP's knobs: on several devices only
    assert list(best["params"]) == [*one_device, *params] and isinstance(
        best["params"]["width"], int
    )
    # middle, first choice
    assert (baseline["params"]["width"], baseline["params"]["kind"]) == (
        28,
        "sgd",
    )
    confirmed = load(path).user_attrs["confirmation"]["configs"][best["label"]]
    assert {k: confirmed[k] for k in params} == {k: best["params"][k] for k in params}
    assert (
        json.loads(run_cli("export", str(path), "--format", "json", capsys=capsys)[1])
        == best["params"]
    )


def test_sys_exit_in_the_users_code_fails_its_trial_and_the_study_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (the CPU default), as in a child: the trial is FAILED "SystemExit: 3", not
    left RUNNING with autotune gone; a rerun has nothing to retry."""
    path = write_study(
        tmp_path,
        task="tests.tasks:calls_sys_exit",
        trials=4,
        batch_sizes=(32, 128),
        confirm={"top": 0, "runs": 0},
        first_trial="sampled",  # the seed's sampled trials reach batch 128; the prior's do not
    )
    assert run_cli("run", str(path), "--quiet", capsys=capsys)[0] == 0
    trials = load(path).trials
    exited = [t for t in trials if t.params["batch_size"] == 128]
    assert exited, "the sampler never tried batch 128; pick another seed"
    assert all(
        t.state == optuna.trial.TrialState.FAIL
        and t.user_attrs["reason"].startswith("SystemExit: 3")
        for t in exited
    )
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
    assert run_cli("run", str(path), "--quiet", capsys=capsys)[0] == 0
    assert len(load(path).trials) == len(trials)  # nothing to retry, the budget met


@pytest.mark.parametrize("task", ["tests.tasks:cuda_oom", "tests.tasks:allocator_oom"])
def test_out_of_memory_prunes_the_trial_and_the_study_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    path = write_study(
        tmp_path, task=task, trials=8, batch_sizes=(32, 64, 128, 256), confirm={"top": 1, "runs": 1}
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    trials = finished(load(path))
    # the budget's 8 ran; any known to run out of memory never did (test below)
    assert len([t for t in trials if "oom_bound" not in t.user_attrs]) == 8
    oom = [t for t in trials if t.user_attrs.get("oom")]
    assert oom, "the sampler never tried a batch of 128 or more; pick another seed"
    for t in oom:
        assert t.state == optuna.trial.TrialState.PRUNED
        assert t.params["batch_size"] >= 128 and "out of memory" in t.user_attrs["reason"]
    assert all(
        t.params["batch_size"] < 128 for t in trials if t.state == optuna.trial.TrialState.COMPLETE
    )
    assert "pruned" in err
    summary = json.loads(run_cli("report", str(path), "--json", capsys=capsys)[1])
    assert summary["counts"]["oom"] == len(oom) and summary["best"]["params"]["batch_size"] < 128


def test_a_configuration_known_to_run_out_of_memory_is_pruned_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once batch_size b ran out of memory, no batch of b or more (in fp32) is trained again."""
    tasks.OOM_RAISED.clear()
    path = write_study(
        tmp_path,
        task="tests.tasks:cuda_oom",
        trials=12,
        batch_sizes=(32, 64, 128, 256),
        confirm={"top": 0},
        first_trial="sampled",  # this seed's sampled trials come back to a large batch
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    trials = finished(load(path))
    ran_out = {t.number: t for t in trials if t.user_attrs.get("oom")}
    skipped = [t for t in trials if "oom_bound" in t.user_attrs]
    assert ran_out and skipped, "the sampler never came back to a large batch; pick another seed"
    assert len(tasks.OOM_RAISED) == len(ran_out)  # a skipped trial never reached the model
    for t in skipped:
        bound = ran_out[t.user_attrs["oom_bound"]]
        assert t.state == optuna.trial.TrialState.PRUNED and bound.number < t.number
        assert (
            t.params["batch_size"] >= bound.params["batch_size"]
            and schema.RESULT not in t.user_attrs
        )
        assert (
            f"trial {bound.number} (batch_size {bound.params['batch_size']} in fp32)"
            in t.user_attrs["reason"]
        )
    sizes = [ran_out[n].params["batch_size"] for n in sorted(ran_out)]
    assert sizes == sorted(set(sizes), reverse=True)  # each real OOM was below every earlier one
    assert "not run: batch_size" in err
    # a trial known to run out cost nothing: the budget's 12 trials are those that ran
    assert len(trials) - len(skipped) == 12


def test_a_space_known_to_run_out_ends_after_the_budget_s_count_of_unrun_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trials known to run out of memory take no slot of the budget, so a space the sampler can
    draw nothing else from would ask without end: as many of them as the budget end it."""
    tasks.OOM_RAISED.clear()
    path = write_study(
        tmp_path, task="tests.tasks:cuda_oom", trials=3, batch_sizes=(512,), confirm={"top": 0}
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    trials = finished(load(path))
    assert [bool(t.user_attrs.get("oom")) for t in trials] == [True, False, False, False]
    assert ["oom_bound" in t.user_attrs for t in trials] == [False, True, True, True]
    assert len(tasks.OOM_RAISED) == 1 and "1/3 finished" in err
    assert (
        "autotune: ended with 1 of 3 trials run: as many as the budget were pruned unrun (3 known "
        "to run out of memory, as smaller ones had; 0 with an effective batch larger than the "
        "training set)" in err
    )


def test_the_probe_runs_once_and_the_trials_use_what_it_settled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, trials=3, confirm={"top": 0})
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(num_workers=[0, 1], prefetch_factor=[2], precision=["fp32", "bf16"])
    raw["probe"] = "systems"  # an earlier engine's name: the joint probe measures
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0 and "autotune: Joint systems probe (" in err and "Joint systems probe (" in out
    outcome = load(path).user_attrs["probe"]
    assert outcome["kind"] == "joint" and outcome["chosen"]["measured"]
    # the load it ran beside (test_measure.py)
    assert outcome["cores"] >= 1 and outcome["other_cores"] >= 0
    for t in finished(load(path)):
        config = t.user_attrs["config"]
        assert config["precision"] in outcome["precisions"]
        assert "num_workers" not in t.params  # settled: not sampled
    # resumed: not probed again
    code, _, err = run_cli("run", str(path), "--trials", "4", capsys=capsys)
    assert (
        code == 0
        and load(path).user_attrs["probe"] == outcome
        and "autotune: Joint systems probe (" not in err
    )

    raw.update(probe="none", name="unprobed")
    path.write_text(yaml.safe_dump(raw))
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    study = optuna.load_study(study_name="unprobed", storage=f"sqlite:///{path.with_suffix('.db')}")
    assert "probe" not in study.user_attrs and all(
        "num_workers" in t.params for t in finished(study)
    )


def test_a_failing_trial_is_recorded_and_the_study_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, task="tests.tasks:broken_model", trials=2)
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 1 and "No trial reached the target" in out
    trials = load(path).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2
    assert "this model cannot be built" in trials[0].user_attrs["reason"]
    line = next(
        n
        for n, text in enumerate((REPO / "tests" / "tasks.py").read_text().splitlines(), 1)
        if "cannot be built" in text
    )
    assert err.strip().splitlines()[-1] == (
        "autotune: every one of the 2 trials failed, so nothing was tuned; "
        "the most common reason (2 of 2): "
        f"ValueError: this model cannot be built (at {REPO / 'tests' / 'tasks.py'}:{line})"
    )
    assert run_cli("export", str(path), "--format", "json", capsys=capsys)[0] == 2


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_diverging_trials_are_pruned_as_diverged_and_the_study_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], isolation: str
) -> None:
    """A learning rate that blows the loss up: each trial stops within a few steps, PRUNED (so the
    sampler learns from it), reason and flag stored, counted apart from the other pruned trials;
    in a child process the same."""
    path = write_study(tmp_path, trials=2, confirm={"top": 0})
    raw = yaml.safe_load(path.read_text())
    raw["space"]["lr"] = {"low": 1e11, "high": 1e12, "log": True}
    raw["probe"] = "none"
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run_cli("run", str(path), "--isolation", isolation, capsys=capsys)
    assert code == 0, err
    trials = load(path).get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.PRUNED] * 2
    for trial in trials:
        assert trial.user_attrs["diverged"] is True and trial.user_attrs["oom"] is False
        assert re.match(
            r"diverged: loss became (nan|inf) at step \d+ \(epoch ", trial.user_attrs["reason"]
        )
    assert (
        "2 pruned (0 could no longer win, 0 out of memory, 0 known to run out, 2 diverged)" in out
    )
    assert "pruned: diverged: loss became" in err


def count_states(db: Path, *states: str) -> int:
    if not db.exists():
        return 0
    marks = ", ".join("?" * len(states))
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return conn.execute(
                f"select count(*) from trials where state in ({marks})", states
            ).fetchone()[0]
    except sqlite3.Error:  # tables not created yet
        return 0


def start_run(path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def training(db: Path) -> bool:
    """A RUNNING trial has its configuration stored: it trains (a trial killed while its
    configuration is being chosen is replaced by a fresh one, not retried)."""
    try:
        with sqlite3.connect(db, timeout=1) as conn:
            return (
                conn.execute(
                    "select count(*) from trials join trial_user_attributes using (trial_id) "
                    "where trials.state = 'RUNNING' and trial_user_attributes.key = 'config'"
                ).fetchone()[0]
                > 0
            )
    except sqlite3.Error:
        return False


def wait_for_trials(
    db: Path, count: int, process: subprocess.Popen, *, running: bool = False, timeout: float = 120
) -> None:
    """Until `count` trials have finished (and, with `running`, the next one is under way)."""
    deadline = time.monotonic() + timeout
    while count_states(db, "COMPLETE", "PRUNED") < count or (
        running and not count_states(db, "RUNNING")
    ):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the study made no progress"
        time.sleep(0.05)


def test_kill_9_then_the_same_command_keeps_every_finished_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Steps of 5 ms: a trial spends nearly all its time training, so the stop below lands in
    # one (with plain blobs a trial trains for milliseconds, and the study could end first).
    # Six trials: two finished, one killed, three to spare for the stops that land between trials;
    # no confirmation (the kill lands among the trials).
    path = write_study(tmp_path, task="tests.tasks:steady_blobs", trials=6, confirm={"top": 0})
    db = path.with_suffix(".db")
    process = start_run(path)
    while True:  # stopped (SIGSTOP) while a trial is training, so that the kill lands inside it
        wait_for_trials(db, 2, process, running=True)
        process.send_signal(signal.SIGSTOP)
        if training(db):
            break
        # between trials, or still choosing its configuration: again
        process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait()
    before = {t.number: (t.params, t.value) for t in finished(load(path))}
    running = [
        t.number for t in load(path).get_trials() if t.state == optuna.trial.TrialState.RUNNING
    ]
    assert len(before) >= 2 and len(running) == 1

    # the same command, in this process (the kill was the other's): no torch import to wait for
    code, _, rerun = run_cli("run", str(path), capsys=capsys)
    assert code == 0, rerun
    study = load(path)
    after = {t.number: (t.params, t.value) for t in finished(study)}
    assert len(after) == 6
    assert {n: after[n] for n in before} == before
    for (
        number
    ) in running:  # the trial the kill interrupted: marked, and its configuration run again
        assert study.trials[number].state == optuna.trial.TrialState.FAIL
        assert study.trials[number].user_attrs["interrupted"]
        assert any(t.system_attrs.get("failed_trial") == number for t in study.trials)
        assert f"trial {number} was interrupted" in rerun


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_marks_the_trial_and_says_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signum: int, status: int
) -> None:
    # four trials and a confirmation: after the first finished trial, time for the signal to land
    path = write_study(tmp_path, trials=4, confirm={"top": 1, "runs": 1})
    process = start_run(path)
    wait_for_trials(path.with_suffix(".db"), 1, process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == status, err
    assert (
        err.strip().splitlines()[-1] == f"Resume with: autotune run {path}"
        and "Traceback" not in err
    )
    study = load(path)
    assert not [t for t in study.get_trials() if t.state == optuna.trial.TrialState.RUNNING]
    with sqlite3.connect(path.with_suffix(".db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    interrupted = [t for t in study.get_trials() if t.user_attrs.get("interrupted")]
    for trial in interrupted:  # the trial the signal stopped says so, and is queued to run again
        assert (
            trial.user_attrs["reason"] == f"interrupted: stopped by {signal.Signals(signum).name}"
        )
        assert any(t.system_attrs.get("failed_trial") == trial.number for t in study.get_trials())

    # the same command, in this process (the signal was the other's)
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    assert len(finished(load(path))) == 4


def test_a_changed_study_file_is_refused_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, trials=1, confirm={"top": 0, "runs": 0})
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    before = path.with_suffix(".db").read_bytes()
    changed = yaml.safe_load(path.read_text())
    changed["target"]["value"] = 0.95
    changed["space"]["lr"]["high"] = 0.5
    changed["budget"]["trials"] = 2  # a bigger budget is not a change to the study's meaning
    path.write_text(yaml.safe_dump(changed))

    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 2
    assert "target.value: 0.9 -> 0.95" in err and "space.lr.high: 0.3 -> 0.5" in err
    assert "--allow-changes" in err
    assert path.with_suffix(".db").read_bytes() == before

    # Other choices for a sampled knob cannot share a study with the old ones, allowed or not.
    path.write_text(
        yaml.safe_dump({**changed, "space": {**changed["space"], "batch_size": [16, 32]}})
    )
    code, _, err = run_cli("run", str(path), "--allow-changes", capsys=capsys)
    assert code == 2 and "space.batch_size: [16, 32, 64] -> [16, 32]" in err and "new name" in err
    assert path.with_suffix(".db").read_bytes() == before
    path.write_text(yaml.safe_dump(changed))

    code, _, err = run_cli("run", str(path), "--allow-changes", capsys=capsys)
    assert code == 0 and "going on after a change to the study: target.value: 0.9 -> 0.95" in err
    study = load(path)
    assert len(finished(study)) == 2
    assert study.user_attrs["definition"]["target"]["value"] == 0.95
    assert study.user_attrs["definition_changes"][0]["from_trial"] == 1
    # the new definition is now the stored one
    assert run_cli("run", str(path), capsys=capsys)[0] == 0


def test_a_command_task_is_pruned_by_killing_it_and_its_oom_is_an_oom(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the study file: trial 0 sets the time to beat; trial 1 passes it while still short of
    the target and is pruned, its process killed; trial 2 dies of CUDA OOM inside the command."""
    pids = tmp_path / "pids"
    pids.mkdir()
    study = {
        "task": {
            "command": f"{sys.executable} {REPO / 'tests' / 'commands' / 'by_trial.py'} "
            f"--seed {{seed}} --pids {pids} --batch-size {{batch_size}}"
        },
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {
            "lr": {"low": 0.01, "high": 0.1},
            "num_workers": 0,
            "precision": "fp32",
            "channels_last": False,
        },
        "budget": {"trials": 4, "max_seconds": 30},
        "confirm": {"top": 0},
        "prune": "incumbent",
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    trials = sorted(load(path).get_trials(), key=lambda t: t.number)
    assert [t.state.name for t in trials[:3]] == ["COMPLETE", "PRUNED", "PRUNED"]
    # a later trial runs unless it needs at least the memory of trial 2, which ran out (the OOM
    # boundary); one known to run out takes no slot of the budget, so the fourth that ran ends it
    later = trials[3:]
    for t in later:
        bounded = t.params["batch_size"] >= trials[2].params["batch_size"]
        assert t.user_attrs.get("oom_bound") == (2 if bounded else None)
        assert (t.state.name == "PRUNED") if bounded else not t.user_attrs.get("oom")
    assert [t for t in later if "oom_bound" not in t.user_attrs] == [later[-1]]
    # it ran: as fast as trial 0, so it reached the target or was pruned just short of its time
    assert later[-1].state.name == "COMPLETE" or "it can no longer win" in schema.reason(later[-1])
    fast = trials[0].value
    assert schema.measured(trials[0])["reached"] and fast < 5
    pruned = trials[1].user_attrs["reason"]
    assert (
        pruned.startswith("pruned: ") and f"({fast:.2f} s, trial 0); it can no longer win" in pruned
    )
    # stopped soon after passing trial 0's time, not at 5 s
    assert fast < trials[1].user_attrs["pruned_at"] < 5
    assert not trials[1].user_attrs.get("oom")
    assert (
        trials[2].user_attrs["oom"]
        and "CUDA out of memory. Tried to allocate 20.00 GiB" in trials[2].user_attrs["reason"]
    )
    for entry in pids.iterdir():  # every command's process is gone, the pruned one's included
        with pytest.raises(ProcessLookupError):
            os.kill(int(entry.name.split("-")[1]), 0)
    complete = sum(t.state.name == "COMPLETE" for t in trials)
    assert (
        "trial 1: pruned:" in err
        and f"Study study: {len(trials)} trials: {complete} complete" in out
    )


def test_an_empty_validation_set_is_refused_before_the_first_trial(tmp_path: Path) -> None:
    """As an empty training set is: named against the task, not found by every trial inside
    torch.cat."""
    from autotune.errors import SpecError
    from autotune.spec import study_file
    from autotune.study import preparation

    path = write_study(tmp_path, task="tests.tasks:no_validation_samples")
    with pytest.raises(
        SpecError,
        match=r"task: got 'tests.tasks:no_validation_samples'; the task's validation set is empty",
    ):
        preparation.prepare(study_file.load(path))


def test_batch_sizes_the_training_set_cannot_fill_are_removed_with_a_notice(tmp_path: Path) -> None:
    from autotune.spec import study_file
    from autotune.study import preparation

    # tests.tasks:blobs trains on 1,024 samples
    path = write_study(tmp_path, batch_sizes=(64, 2048, 4096))
    prepared = preparation.prepare(study_file.load(path))
    assert prepared.space["batch_size"].values == (64,)
    assert (
        "batch_size 2048, 4096 removed from the search space: the task has 1024 training samples"
        in prepared.notices
    )


def test_loader_workers_beyond_this_machines_cores_are_removed_with_a_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study written for a GPU node (16 workers) still runs on a 2-core machine, without them."""
    import yaml

    from autotune.spec import study_file
    from autotune.study import feasibility, preparation

    path = write_study(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["space"]["num_workers"] = [0, 2, 8, 16]
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(feasibility, "cpu_count", lambda: 2)
    prepared = preparation.prepare(study_file.load(path))
    assert prepared.space["num_workers"].values == (0, 2, 8)
    assert (
        "num_workers 16 removed from the search space: 2 CPU cores are available to autotune here "
        "(at most 4 loader workers a core)"
    ) in prepared.notices

    raw["space"]["num_workers"] = {"low": 0, "high": 64}  # a range is cut at the limit
    path.write_text(yaml.safe_dump(raw))
    prepared = preparation.prepare(study_file.load(path))
    assert (prepared.space["num_workers"].low, prepared.space["num_workers"].high) == (0, 8)
    assert (
        "num_workers 9 to 64 removed from the search space: 2 CPU cores are available to autotune "
        "here (at most 4 loader workers a core)"
    ) in prepared.notices


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_the_loader_worker_limit_counts_the_cores_this_process_may_use(tmp_path: Path) -> None:
    """Under taskset (or a scheduler's cgroup) to one core, 8 workers are too many however many
    cores the machine has."""
    import yaml

    from autotune.spec import study_file
    from autotune.study import preparation

    path = write_study(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["space"]["num_workers"] = [0, 2, 8]
    path.write_text(yaml.safe_dump(raw))
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        prepared = preparation.prepare(study_file.load(path))
    finally:
        os.sched_setaffinity(0, allowed)
    assert prepared.space["num_workers"].values == (0, 2)
    assert (
        "num_workers 8 removed from the search space: 1 CPU core is available to autotune here "
        "(at most 4 loader workers a core)"
    ) in prepared.notices


def test_a_command_that_stops_reporting_is_still_pruned_once_its_clock_passes_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trial 1 reports once, then trains silently for 30 s: killed soon after trial 0's time, not
    recorded as complete when it finally speaks."""
    study = {
        "task": {
            "command": f"{sys.executable} {REPO / 'tests' / 'commands' / 'goes_silent.py'} "
            "--seed {seed}"
        },
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {
            "lr": {"low": 0.01, "high": 0.1},
            "num_workers": 0,
            "precision": "fp32",
            "channels_last": False,
        },
        "budget": {"trials": 2, "max_seconds": 60},
        "confirm": {"top": 0},
        "prune": "incumbent",
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    started = time.monotonic()
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    first, second = sorted(load(path).get_trials(), key=lambda t: t.number)
    assert first.state.name == "COMPLETE" and second.state.name == "PRUNED"
    # within a poll or two of passing it
    assert first.value < second.user_attrs["pruned_at"] < first.value + 2
    assert time.monotonic() - started < 25  # the silent 30 s were not waited out


def test_a_confirmation_that_no_longer_covers_the_fastest_trials_is_not_reported_as_confirmed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A faster trial stored after the confirmation (a later run stopped before it confirmed
    again, or another worker): report and export name the fastest trial as not confirmed and
    say that `autotune run` redoes the confirmation."""
    path = write_study(tmp_path, trials=2, confirm={"top": 1, "runs": 1})
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    study = load(path)
    confirmed = study.user_attrs["confirmation"]
    best = min(
        (
            t
            for t in study.get_trials()
            if t.state.name == "COMPLETE" and max(t.constraints.values()) <= 0
        ),
        key=lambda t: t.value,
    )
    faster = optuna.trial.create_trial(
        params=best.params,
        distributions=best.distributions,
        value=best.value / 2,
        user_attrs=best.user_attrs,
        constraints=best.constraints,
    )
    study.add_trial(faster)
    number = max(t.number for t in study.get_trials())

    code, out, _ = run_cli("report", str(path), capsys=capsys)
    assert code == 0
    assert f"Winner: trial {number} (single run, not confirmed)" in out
    assert (
        "Not confirmed: the confirmation on fresh seeds was taken after "
        f"{confirmed['after_trials']} trials, of trials "
        f"{confirmed['trials'][0]}, and the study's fastest trials have changed since"
    ) in out
    assert "Re-measured side by side" not in out
    code, out, _ = run_cli("export", str(path), "--format", "yaml", capsys=capsys)
    assert code == 0 and f"trial {number} (single run, not confirmed, 1 run)" in out.splitlines()[0]


def test_a_trial_killed_before_its_configuration_was_stored_is_replaced_not_promised_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a kill between Optuna's ask and the configuration's write leaves: a RUNNING trial with
    no configuration. The next run says a new trial takes its place, and the budget is met."""
    path = write_study(tmp_path, trials=2, confirm={"top": 0})
    made = optuna.create_study(study_name="study", storage=f"sqlite:///{path.with_suffix('.db')}")
    schema.begin_study(
        made, target={"metric": "accuracy", "value": 0.9}, optimizer=None, knobs=None
    )
    made.ask()  # then killed
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    assert (
        "autotune: trial 0 was interrupted; it is marked failed and a new trial takes its place "
        "(it stopped before its configuration was chosen)"
    ) in err
    assert "will run again" not in err
    trials = load(path).get_trials()
    assert (
        trials[0].user_attrs["interrupted"] and len(finished(load(path))) == 2 and len(trials) == 3
    )


def test_a_trial_killed_in_the_last_slot_of_the_budget_runs_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kill during the budget's last trial: its retry waits in the queue, holding the last slot.
    The same command runs it, rather than finding the budget spent."""
    path = write_study(tmp_path, trials=3, confirm={"top": 0})
    code, _, err = run_cli("run", str(path), "--trials", "2", capsys=capsys)
    assert code == 0, err
    study = load(path)
    last = study.ask()  # the budget's last trial, killed once its configuration was stored
    last.set_user_attr("config", study.trials[0].user_attrs["config"])
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    assert f"trial {last.number} was interrupted; it is marked failed and will run again" in err
    trials = load(path).trials
    assert (
        len(finished(load(path))) == 3
        and trials[-1].system_attrs.get("failed_trial") == last.number
    )


def test_a_baseline_told_apart_by_its_first_run_is_not_run_on_the_rest_and_the_report_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """confirm.baseline: until_resolved, with a baseline that learns too slowly to reach the
    target."""
    path = write_study(
        tmp_path, trials=2, confirm={"top": 1, "runs": 4, "baseline": "until_resolved"}
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(lr=0.1, scheduler="constant")
    raw["baseline"] = {"lr": 0.0001}
    raw["budget"]["max_seconds"] = 1.5
    path.write_text(yaml.safe_dump(raw))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    runs = load(path).user_attrs["confirmation"]["runs"]
    # checked at its second seed, once the winner has run twice: its one run missed the target
    assert [r["label"] for r in runs].count("baseline") == 1 and len(runs) == 1 + 4
    assert (
        "The baseline ran on 1 of the 4 seeds: by then its run took at least 2x the "
        "slowest run of every other configuration, so more could not change which is faster "
        "(confirm.baseline: until_resolved)"
    ) in out
    code, out, _ = run_cli("report", str(path), "--json", capsys=capsys)
    assert json.loads(out)["confirmation"]["baseline_resolved_by"] == 2.0


def test_the_largest_seed_runs_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every seed derived from the study's (the sampler's grows with the trials stored) still
    fits."""
    from autotune.spec.study_file import MAX_SEED

    path = write_study(tmp_path, trials=1, seed=MAX_SEED, confirm={"top": 0, "runs": 1})
    assert run_cli("run", str(path), "--quiet", capsys=capsys)[0] == 0
    assert run_cli("run", str(path), "--trials", "2", "--quiet", capsys=capsys)[0] == 0
    assert len(load(path).trials) == 2


def test_a_batch_and_accumulation_pair_larger_than_the_training_set_is_pruned_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """batch_size and accumulation_steps are drawn apart: 512 x 4 asks for 2048 of the 1024 training
    samples. Such a trial is PRUNED before it trains (the sampler learns it), not FAILED in the
    loop."""
    path = write_study(tmp_path, trials=6, batch_sizes=(512,), confirm={"top": 0})
    study = yaml.safe_load(path.read_text())
    study["space"]["accumulation_steps"] = [1, 4]
    path.write_text(yaml.safe_dump(study))
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    too_large = [t for t in load(path).trials if t.params["accumulation_steps"] == 4]
    assert too_large, "the seed drew no 512 x 4 trial"
    for trial in too_large:
        assert trial.state.name == "PRUNED" and "result" not in trial.user_attrs
        assert trial.user_attrs["reason"] == (
            "pruned: an effective batch of 2048 (512 x 4) is larger than the 1024 "
            "training samples; it cannot take one optimizer step an epoch"
        )
    assert all(t.state.name != "FAIL" for t in load(path).trials)
    # never run, they cost nothing: the budget's 6 trials are those that ran
    assert len(load(path).trials) - len(too_large) == 6
    # the report counts them apart: not among those that could no longer win
    code, out, _ = run_cli("report", str(path), "--json", capsys=capsys)
    assert code == 0
    counts = json.loads(out)["counts"]
    assert counts["too_large"] == len(too_large)
    assert counts["past_incumbent"] == counts["pruned"] - len(too_large)
    code, out, _ = run_cli("report", str(path), capsys=capsys)
    assert code == 0 and f"known to run out, {len(too_large)} larger than the training set)" in out
    html = tmp_path / "report.html"
    assert run_cli("report", str(path), "--html", str(html), capsys=capsys)[0] == 0
    assert f"known to run out, {len(too_large)} larger than the training set)" in html.read_text()


def test_trials_pruned_unrun_take_no_slot_and_as_many_as_the_budget_end_the_study_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stored trials of both kinds pruned before they trained (an effective batch larger than the
    training set, a configuration past the OOM boundary) beside two that ran: only those two count
    against the budget; three unrun end a budget of 3 and the study says which kinds they were."""
    from autotune.study import budget, run

    spec = load_spec(write_study(tmp_path, trials=3))
    study = optuna.create_study()
    for attrs in ({}, {}, {"too_large": True}, {"too_large": True}, {"oom_bound": 0}):
        state = optuna.trial.TrialState.PRUNED if attrs else optuna.trial.TrialState.COMPLETE
        study.add_trial(
            optuna.trial.create_trial(
                state=state, value=None if attrs else 1.0, user_attrs={"reason": "r", **attrs}
            )
        )
    trials = study.get_trials(deepcopy=False)
    assert budget.finished_count(trials) == 2
    assert budget.run_out_unrun(trials, 3) and not budget.run_out_unrun(trials, 4)
    run._say_if_short_of_budget(spec, study, time.monotonic())
    assert capsys.readouterr().err == (
        "autotune: ended with 2 of 3 trials run: as many as the budget were pruned unrun (1 known "
        "to run out of memory, as smaller ones had; 2 with an effective batch larger than the "
        "training set): the space's micro-batches, accumulation steps or precisions are mostly "
        "more than the device or the data holds\n"
    )


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_batch_that_runs_out_of_memory_is_pruned_without_checkpointing_and_trains_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpointing: bool
) -> None:
    """tests.tasks:activation_budget runs out of memory at a batch of 128 unless its blocks are
    checkpointed: without, the first trial is PRUNED as out of memory and the next ones known to
    run out (as many as the budget: they take no slot of it); with, both train."""
    path = write_study(
        tmp_path,
        task="tests.tasks:activation_budget",
        trials=2,
        batch_sizes=(128,),
        confirm={"top": 0},
    )
    raw = yaml.safe_load(path.read_text())
    # an lr that never diverges here; no trial cut short as too slow
    raw["space"].update(checkpointing=checkpointing, lr=0.05, accumulation_steps=1)
    raw.update(baseline={"batch_size": 128, "lr": 0.05}, prune="none")
    path.write_text(yaml.safe_dump(raw))
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    first, *later = finished(load(path))
    assert all(schema.trained_config(t)["checkpointing"] is checkpointing for t in [first, *later])
    if checkpointing:
        assert [t.state.name for t in [first, *later]] == ["COMPLETE", "COMPLETE"]
    else:
        assert [t.state.name for t in [first, *later]] == ["PRUNED"] * 3
        assert first.user_attrs["oom"] is True and "out of memory" in first.user_attrs["reason"]
        assert [t.user_attrs["oom_bound"] for t in later] == [first.number] * 2


def test_a_training_set_too_large_for_the_device_leaves_its_loaders_batches_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baseline, queued first with its data on the device, runs out of memory copying the
    set: that bounds later trials with the set on the device at a batch as large, and none fed
    by a DataLoader, at whatever batch."""
    path = write_study(
        tmp_path,
        task="tests.tasks:too_large_for_the_device",
        trials=6,
        first_trial="baseline",
        confirm={"top": 0},
        seed=1,
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"]["data_on_device"] = [True, False]
    raw.update(baseline={"batch_size": 16, "data_on_device": True}, prune="none", probe="none")
    path.write_text(yaml.safe_dump(raw))
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    first, *later = sorted(finished(load(path)), key=lambda t: t.number)
    assert (
        first.user_attrs["oom"] is True and schema.trained_config(first)["data_on_device"] is True
    )
    on = [t for t in later if schema.trained_config(t)["data_on_device"]]
    fed = [t for t in later if not schema.trained_config(t)["data_on_device"]]
    assert on and fed, "the sampler chose one way only; pick another seed"
    assert all(t.user_attrs["oom_bound"] == first.number for t in on)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in fed)
    assert any(t.params["batch_size"] >= 16 for t in fed)
