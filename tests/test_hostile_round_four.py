"""A fourth hostile round, on new ground: links and other names for a study's files, storages that
fail mid-run, studies that are not autotune's, and a second run inside one process.

The contract is the earlier rounds' (tests/test_hostile_round.py, whose helpers these cases use):
a user's mistake is one line, exit 2, no traceback, and every file as it was; a fault keeps every
finished trial, and the same command run again goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest

import autotune
from autotune.errors import StorageError
from tests.test_hostile_round import (
    EASY,
    GATE,
    HELD,
    REPO,
    SLOW,
    STARTED,
    TAG,
    Stored,
    as_they_start,
    assert_nothing_left,
    assert_refused,
    assert_unchanged,
    assert_usage_error,
    cli,
    ended_on_exit,
    fill,
    finished,
    place,
    place_held,
    reasons,
    saying,
    small_disk,
    snapshot,
    spawn,
    stored,  # noqa: F401 - the fixture: a finished study
    tag,  # noqa: F401 - the fixture, for the cases that start processes
    tagged_processes,
    trials_of,
)

# ---------------------------------------------------------------------------------------------
# The runner lock's name taken by something else


@pytest.mark.parametrize("target", ["study.yaml", "other.db"])
def test_a_runner_lock_that_is_a_symbolic_link_is_refused_and_what_it_names_is_left_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """`ln -s study.yaml study.db.runner.lock`: opening the lock through the link would write the
    runner's pid over the study file (or another study's database)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(EASY)
    (tmp_path / "other.db").write_bytes(b"SQLite format 3\x00 another study, kept as it is")
    (tmp_path / "study.db.runner.lock").symlink_to(target)
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, "run", "study.yaml"), "study.db.runner.lock", "symbolic link")
    assert_unchanged(before, tmp_path)


def test_a_runner_lock_that_is_a_hard_link_to_the_study_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(EASY)
    os.link(tmp_path / "study.yaml", tmp_path / "study.db.runner.lock")
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, "run", "study.yaml"), "study.db.runner.lock", "other names")
    assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# A journal that a full disk cut short


def test_a_journal_cut_short_by_a_full_disk_is_mended_and_the_study_resumes_with_every_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills as a record is appended: the journal ends in half a line. The same command,
    once space is freed, sets the half aside, keeps every finished trial and runs to its budget;
    the report reads the study after."""
    monkeypatch.chdir(tmp_path)
    journal = ("--storage", "journal:///disk/study.journal")
    with small_disk(tmp_path / "disk", "2m") as disk:
        (disk / "study.yaml").write_text(EASY)
        assert cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "1", *journal).code == 0
        fill(disk)
        # one page free: the run's lock file fits, and the journal's next records outgrow it
        os.truncate(disk / "filler", (disk / "filler").stat().st_size - 4096)
        full = cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "4", *journal)
        assert full.code == 2 and "Traceback" not in full.err, full.err
        assert "no space left on the device" in full.err.splitlines()[-1]
        text = (disk / "study.journal").read_bytes()
        assert not text.endswith(b"\n"), "the disk filled between two records: no torn line"
        (disk / "filler").unlink()
        storage = f"journal:///{disk / 'study.journal'}"
        before = finished(optuna.load_study(study_name="study", storage=_journal(disk)).trials)
        assert before >= 1
        again = cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "4", *journal)
        assert again.code == 0 and "Traceback" not in again.err, again.err
        assert "cut short" in again.err and "study.journal.torn-1" in again.err
        assert (disk / "study.journal").read_bytes().endswith(b"\n")
        assert finished(trials_of(disk, storage=_journal(disk))) == 4
        report = cli(capsys, "report", "disk/study.yaml", "--json", "--storage", storage)
        assert report.code == 0 and report.err == "", report.err
        assert json.loads(report.out)["best"] is not None


def _journal(folder: Path) -> optuna.storages.JournalStorage:
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(str(folder / "study.journal")))


# ---------------------------------------------------------------------------------------------
# The same storage under another name, while a run trains


def test_a_second_run_on_the_same_storage_under_another_name_is_refused_and_the_first_ends_whole(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811
) -> None:
    """A symbolic link, a hard link, the URL with `?timeout=5`: each is the running study's file,
    and a second run on it would mark the first's live trial interrupted; so is the study file's
    own SQLite storage, which a plain second `autotune run study.yaml` opens. A SQLite and a
    journal study, their first runs started at once (each held until every alias was refused)."""
    firsts = {}
    for kind in ("sqlite", "journal"):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "study.yaml").write_text(HELD)
        gate = place_held(folder)  # the first's trial 0 trains until every alias was refused
        name = "study.db" if kind == "sqlite" else "study.journal"
        marker = folder / "started"
        first = spawn(
            folder,
            tag,
            *("run", "study.yaml", "--quiet", "--trials", "2", "--storage", f"{kind}:///{name}"),
            **{STARTED: str(marker), GATE: str(gate)},
        )
        firsts[kind] = (marker, first)
    with ended_on_exit(*(first for _, first in firsts.values())):
        for kind in as_they_start(firsts):
            folder, first = tmp_path / kind, firsts[kind][1]
            name = "study.db" if kind == "sqlite" else "study.journal"
            (folder / f"soft-{name}").symlink_to(name)
            os.link(folder / name, folder / f"hard-{name}")
            aliases = [f"soft-{name}", f"hard-{name}", "sub/../" + name]
            (folder / "sub").mkdir()
            if kind == "sqlite":
                aliases.append(f"{name}?timeout=5")
            with contextlib.chdir(folder), saying(kind):
                if kind == "sqlite":  # the study file's own storage, by no other name
                    second = cli(capsys, "run", "study.yaml")
                    assert_refused(second, "study.yaml", "is being run by", f"pid {first.pid}")
                for alias in aliases:
                    second = cli(capsys, "run", "study.yaml", "--storage", f"{kind}:///{alias}")
                    assert_refused(second, "is being run by")
            (folder / "gate" / "open").touch()
        for kind, (_, first) in firsts.items():
            folder = tmp_path / kind
            out, err = first.communicate(timeout=180)
            with saying(kind):
                assert first.returncode == 0 and "Traceback" not in err, err
                storage = (
                    f"sqlite:///{folder / 'study.db'}" if kind == "sqlite" else _journal(folder)
                )
                trials = trials_of(folder, storage=storage)
                assert finished(trials) == 2
                assert not [t for t in trials if "interrupted" in t.user_attrs.get("reason", "")]


# ---------------------------------------------------------------------------------------------
# A second run inside one process


SPACE = {
    "lr": {"low": 0.02, "high": 0.3, "log": True},
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "num_workers": 0,
    "precision": "fp32",
}
BUDGET = {"trials": 3, "max_epochs": 1, "max_seconds": 10}


def test_tune_called_from_inside_a_trial_on_its_own_study_is_refused_and_the_trial_goes_on(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'nested.db'}"
    refusals: list[str] = []

    def objective(config: dict) -> tuple[float, float]:
        try:
            autotune.tune(
                objective=objective, target=0.5, name="nested", storage=storage, space=SPACE
            )
        except StorageError as error:
            refusals.append(str(error))
        return 1.0, 0.9

    autotune.tune(
        objective=objective,
        target=0.5,
        name="nested",
        storage=storage,
        space=SPACE,
        budget=BUDGET,
        confirm={"top": 0},
    )
    assert len(refusals) == 3 and all("by this process already" in r for r in refusals)
    trials = optuna.load_study(study_name="nested", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3


def test_two_threads_tuning_one_study_at_once_run_it_once(tmp_path: Path) -> None:
    """Two threads start together: one runs the study to its budget, the other is refused in one
    sentence; neither sees Optuna's errors of a study written twice."""
    storage = f"sqlite:///{tmp_path / 'twice.db'}"
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def objective(config: dict) -> tuple[float, float]:
        threading.Event().wait(0.2)
        return 1.0, 0.9

    def tune() -> None:
        start.wait()
        try:
            autotune.tune(
                objective=objective,
                target=0.5,
                name="twice",
                storage=storage,
                space=SPACE,
                budget=BUDGET,
                confirm={"top": 0},
            )
            outcomes.append("ran")
        except StorageError as error:
            outcomes.append(str(error))
        except Exception as error:  # noqa: BLE001 - what the case is about
            outcomes.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=tune) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(outcomes) == 2 and outcomes.count("ran") == 1, outcomes
    assert any("by this process already" in outcome for outcome in outcomes), outcomes
    trials = optuna.load_study(study_name="twice", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3


# ---------------------------------------------------------------------------------------------
# A study autotune did not make


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_plain_optuna_study_of_the_same_name_is_refused_by_every_command_and_left_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(EASY)
    name = "study.db" if kind == "sqlite" else "study.journal"
    url = f"{kind}:///{tmp_path / name}"
    opened = f"sqlite:///{tmp_path / name}" if kind == "sqlite" else _journal(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    theirs = optuna.create_study(study_name="study", storage=opened, direction="maximize")
    theirs.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    before = snapshot(tmp_path)
    for command in (
        ("run", "study.yaml"),
        ("report", "study.yaml"),
        ("export", "study.yaml", "--format", "torch", "-o", "winner.py"),
    ):
        assert_refused(
            cli(capsys, *command, "--storage", url), "that autotune did not make", "3 trial(s)"
        )
        assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# What user code raises that is not an Exception


FAILS_ITS_TRIALS = [
    ("KeyboardInterrupt", "raises_keyboard_interrupt", "none", "KeyboardInterrupt: raised by"),
    ("KeyboardInterrupt", "raises_keyboard_interrupt", "warm", "KeyboardInterrupt: raised by"),
    ("BaseException", "raises_a_base_exception", "none", "QuotaExceeded: GPU-hour quota"),
    ("BaseException", "raises_a_base_exception", "process", "QuotaExceeded: GPU-hour quota"),
    ("sys.exit in the model factory", "model_factory_exits", "none", "SystemExit: 3"),
    ("sys.exit in the model factory", "model_factory_exits", "process", "SystemExit: 3"),
    ("sys.exit in the model factory", "model_factory_exits", "warm", "SystemExit: 3"),
    (
        "samples without targets",
        "samples_without_targets",
        "none",
        "the task's training set gives one tensor of shape [",
    ),
    (
        "samples as triples",
        "samples_as_triples",
        "none",
        "the task's training set gives a list of 3 items for a batch",
    ),
    (
        "device_train returns None",
        "device_train_returns_none",
        "none",
        "device_train(device) returned NoneType, not a function",
        "data_on_device: true, ",
    ),
]
FAILS_IN_PROCESS = [case for case in FAILS_ITS_TRIALS if case[2] == "none"]
FAILS_IN_CHILDREN = [case for case in FAILS_ITS_TRIALS if case[2] != "none"]


def _fails_its_trials_study(folder: Path, task: str, isolation: str, space: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "study.yaml").write_text(
        f"task: tests.hostile.tasks:{task}\ntarget: {{metric: accuracy, value: 0.5}}\n"
        # the default space (channels_last searched): the model is built before the first trial
        f"space: {{{space}num_workers: 0, accumulation_steps: 1}}\n"
        f"probe: none\nbudget: {{trials: 2, max_epochs: 1}}\nconfirm: {{top: 0}}\n"
        f"isolation: {isolation}\n"
    )


def _failed_its_trials(folder: Path, code: int | None, out: str, err: str, why: str) -> None:
    """Exit 1, the report, one last line saying why, both trials FAIL with the reason."""
    assert "Traceback" not in err + out, err[-3000:]
    assert code == 1, f"exit {code}; stderr:\n{err[-3000:]}"
    assert out.startswith("Study study: 2 trials"), out[:500]
    last = err.strip().splitlines()[-1]
    assert last.startswith("autotune: every one of the 2 trials failed") and why in last, last
    trials = trials_of(folder)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"], [t.state for t in trials]
    assert all(why in reason for reason in reasons(trials)), reasons(trials)


@pytest.mark.parametrize(
    ("task", "why", "space"),
    [(case[1], case[3], case[4] if len(case) > 4 else "") for case in FAILS_IN_PROCESS],
    ids=[f"{case[0]}, isolation none" for case in FAILS_IN_PROCESS],
)
def test_what_user_code_raises_beyond_exception_fails_its_trial_and_the_study_ends(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811 - the fixture
    task: str,
    why: str,
    space: str,
) -> None:
    """A KeyboardInterrupt no signal raised, a BaseException subclass, sys.exit in the model factory
    (which autotune also calls before any trial): the trial FAILS with its reason, the study ends
    with status 1 and says why, and nothing is left RUNNING for the next run to repeat. Under
    isolation none, in this process."""
    monkeypatch.chdir(tmp_path)
    _fails_its_trials_study(tmp_path, task, "none", space)
    code, out, err = dataclasses.astuple(cli(capsys, "run", "study.yaml", "--quiet"))
    _failed_its_trials(tmp_path, code, out, err, why)


def test_what_user_code_raises_beyond_exception_fails_its_trial_in_a_child_process_too(
    tmp_path: Path,
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """The same, under isolation process and warm: each case a study of its own in a process of
    its own (a fork server started in this process would outlive the test). They run at once, as
    nothing in them depends on timing: most of each is imports and waiting."""
    runs = {}
    for case in FAILS_IN_CHILDREN:
        folder = tmp_path / f"{case[1]}-{case[2]}"
        _fails_its_trials_study(folder, case[1], case[2], "")
        runs[case] = (folder, spawn(folder, tag, "run", "study.yaml", "--quiet"))
    with ended_on_exit(*(run for _, run in runs.values())):
        for case, (folder, run) in runs.items():
            out, err = run.communicate(timeout=180)
            with saying(f"{case[0]}, isolation {case[2]}"):
                _failed_its_trials(folder, run.returncode, out, err, case[3])


# ---------------------------------------------------------------------------------------------
# Datasets whose length cannot be trained


@pytest.mark.parametrize(
    ("task", "fragments"),
    [
        ("length_negative", ("len() of the task's training set", "ValueError", "whole number")),
        ("length_fractional", ("len() of the task's training set", "TypeError", "'float'")),
        ("length_a_trillion", ("1000000000000 samples", "shuffle", "GiB of memory")),
    ],
    ids=["__len__ -1", "__len__ 1024.5", "__len__ 10^12"],
)
def test_a_training_set_whose_length_cannot_be_trained_is_one_line_before_any_trial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    task: str,
    fragments: tuple[str, ...],
) -> None:
    """Not a traceback, and not a trillion-sample set taken for a trial out of memory (which would
    prune the whole space unrun)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(
        EASY.replace("tests.tasks:blobs", f"tests.hostile.tasks:{task}")
    )
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", "task", *fragments)
    assert_unchanged(before, tmp_path)


def test_a_baseline_batch_over_the_training_set_across_a_trial_s_devices_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """128 x 1 x 16 devices = 2048 samples a step from a set of 1024: the baseline could never
    take an optimizer step, and a winner would be named against a baseline that never trained."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(
        EASY.replace("batch_size: [32, 64]", "batch_size: [8, 16]")
        + "devices_per_trial: 16\nbaseline: {batch_size: 128}\n"
    )
    before = snapshot(tmp_path)
    assert_refused(
        cli(capsys, "run", "study.yaml"),
        "baseline.batch_size",
        "128 x 1 x 16",
        "1024 training samples",
    )
    assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# A training command's failure read from its stderr

MENTIONS_MEMORY = """\
import sys
print("warning: CUDA out of memory on the first try; retrying with half the batch", file=sys.stderr)
print("MemoryError: cache full, evicting the oldest entries", file=sys.stderr)
raise ValueError("label 11 is out of range")
"""


def test_a_command_whose_log_mentions_memory_but_fails_otherwise_is_no_oom_and_prunes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its final error decides: each trial FAILS with it, and none is pruned unrun by an
    out-of-memory boundary that a log line drew (one batch size: any would be)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(MENTIONS_MEMORY)
    (tmp_path / "study.yaml").write_text(
        "target: {metric: accuracy, value: 0.5}\n"
        'task: {command: "python train.py --lr {lr}"}\n'
        "space: {lr: {low: 0.05, high: 0.5, log: true}, batch_size: [32]}\n"
        "probe: none\nbudget: {trials: 3, max_epochs: 1}\nconfirm: {top: 0}\n"
    )
    result = cli(capsys, "run", "study.yaml", "--quiet")
    assert "Traceback" not in result.out, result.out
    assert result.code == 1, result.err[-3000:]
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials] == ["FAIL"] * 3, reasons(trials)
    assert all("ValueError: label 11 is out of range" in r for r in reasons(trials)), reasons(
        trials
    )


# ---------------------------------------------------------------------------------------------
# What a changed study file's refusal says of the trials stored


def test_a_changed_study_file_s_refusal_counts_queued_trials_apart_and_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose time was up before its first trial leaves only the baseline queued: none of the
    stored trials was measured, and the refusal says so; it names the key to rename the study by,
    not a dangling "name:"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(EASY)
    assert cli(capsys, "run", "study.yaml", "--timeout", "0.001", "--quiet").code == 0
    assert [t.state.name for t in trials_of(tmp_path)] == ["WAITING"]
    (tmp_path / "study.yaml").write_text(EASY.replace("value: 0.5", "value: 0.6"))
    before = snapshot(tmp_path)
    line = assert_refused(
        cli(capsys, "run", "study.yaml"),
        "target.value: 0.5 -> 0.6",
        "The 1 trial(s) stored are queued under the old settings, none measured yet",
        "--allow-changes",
    )
    assert line.endswith("give the study a new name (the study file's name: key)"), line
    assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# Standard streams closed, or unable to encode


def test_a_closed_standard_stream_loses_only_what_was_said_there(
    tmp_path: Path,
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """The study runs to its budget and ends 0; what the open stream gets is still written. Each
    way of closing a study of its own, the three run at once."""
    runs = {}
    for number, closed in enumerate(("2>&-", ">&-", ">&- 2>&-")):
        folder = tmp_path / f"closed-{number}"
        folder.mkdir()
        (folder / "study.yaml").write_text(EASY)
        shell = f"{shlex.quote(sys.executable)} -m autotune run study.yaml {closed}"
        runs[closed] = subprocess.Popen(
            ["bash", "-c", shell],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(REPO), TAG: tag},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    with ended_on_exit(*runs.values()):
        for number, (closed, run) in enumerate(runs.items()):
            out, err = run.communicate(timeout=180)
            with saying(closed):
                assert run.returncode == 0, err[-3000:]
                assert finished(trials_of(tmp_path / f"closed-{number}")) == 2
                if closed == "2>&-":
                    assert out.startswith("Study study: 2 trials"), out[:500]
                if closed == ">&-":
                    assert "Traceback" not in err and "trial 1:" in err, err[-3000:]


def test_a_stdout_that_cannot_encode_the_study_s_name_gets_escapes_not_a_traceback(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """`run` and `report` on an ASCII stdout. The report reads a study of its own, run in this
    process while the `run` process starts: the two processes run at once."""
    ran, reported = tmp_path / "ran", tmp_path / "reported"
    for folder in (ran, reported):
        folder.mkdir()
        (folder / "étude.yaml").write_text(EASY + "name: étude-réseau\n")

    def ascii_stdout(folder: Path, command: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "autotune", command, "étude.yaml"],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(REPO), TAG: tag, "PYTHONIOENCODING": "ascii"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    run = ascii_stdout(ran, "run")
    with ended_on_exit(run):
        with contextlib.chdir(reported):
            assert cli(capsys, "run", "étude.yaml", "--quiet").code == 0
        report = ascii_stdout(reported, "report")
        with ended_on_exit(report):
            outputs = []
            for process in (run, report):
                out, err = process.communicate(timeout=180)
                assert process.returncode == 0 and b"Traceback" not in err, err[-3000:]
                outputs.append(out)
    assert all(out.startswith(b"Study \\xe9tude-r\\xe9seau: 2 trials") for out in outputs), outputs
    for folder in (ran, reported):
        storage = f"sqlite:///{folder / 'étude.db'}"
        assert finished(trials_of(folder, name="étude-réseau", storage=storage)) == 2


# ---------------------------------------------------------------------------------------------
# Signals to a warm child's study


WARM_SIGNALS = {
    "SIGTERM to the group": (signal.SIGTERM, True),
    "Ctrl-C to the group": (signal.SIGINT, True),
    "SIGTERM to autotune alone": (signal.SIGTERM, False),
}


def test_a_signal_under_isolation_warm_ends_with_its_status_and_no_traceback(
    tmp_path: Path,
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """Each signal to a study of its own, the three run at once: each is sent the moment its
    run's trial trains (the runs watched together, none waits on another)."""
    runs = {}
    for case in WARM_SIGNALS:
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        (folder / "study.yaml").write_text(SLOW + "isolation: warm\n")
        marker = folder / "started"
        runs[case] = (marker, spawn(folder, tag, "run", "study.yaml", **{STARTED: str(marker)}))
    with ended_on_exit(*(run for _, run in runs.values())):
        for case in as_they_start(runs):
            (signum, group), run = WARM_SIGNALS[case], runs[case][1]
            if group:
                os.killpg(run.pid, signum)
            else:
                run.send_signal(signum)
        for case, (_, run) in runs.items():
            out, err = run.communicate(timeout=90)
            with saying(case):
                assert run.returncode == 128 + WARM_SIGNALS[case][0], err
                assert "Traceback" not in err, err
                assert err.strip().splitlines()[-1] == "Resume with: autotune run study.yaml", err
    assert_nothing_left(tag)
    for case, (marker, _) in runs.items():
        trials = trials_of(marker.parent)
        assert not [t.number for t in trials if t.state.name == "RUNNING"], case


# ---------------------------------------------------------------------------------------------
# The storage failing while a study runs

# Faults caused between trials 0 and 1: the run is held at trial 1's first step (place_held) until
# the fault is in place, so a budget of 2 leaves it nothing to finish first. The size limit is
# reached where the journal grows past it, not where a case chooses: that run is not held, and
# its journal passes 8 KiB in its third trial (under 7.7 KiB after two, over 10 after three).
HELD_BUDGET = 2
UNHELD_BUDGET = 3


def _run_until_a_trial_finished(
    folder: Path,
    tagged: str,
    *args: str,
    prefix: str = "",
    user: str | None = None,
    held: bool = True,
    wait: bool = True,
) -> tuple[subprocess.Popen[str], Path]:
    """`autotune run study.yaml ARGS` in `folder` (under the shell's `prefix`, as `user`), its
    stderr in a file; returns once it has said that trial 0 finished (`held`: with trial 1 kept
    from finishing until `_ended_on_a_storage_fault`; not `wait`: at once)."""
    if held:
        study = HELD.replace("trials: 3", f"trials: {HELD_BUDGET}")
        gate = {GATE: str(place_held(folder, tickets=1))}
    else:
        study, gate = SLOW.replace("trials: 3", f"trials: {UNHELD_BUDGET}"), {}
    (folder / "study.yaml").write_text(study)
    err = folder / "err.txt"
    command = f"{prefix} {shlex.quote(sys.executable)} -m autotune run study.yaml {' '.join(args)}"
    if user is not None:
        ids = pwd.getpwnam(user)
        command = f"setpriv --reuid={ids.pw_uid} --regid={ids.pw_gid} --clear-groups {command}"
    run = subprocess.Popen(
        ["bash", "-c", f"{command} 2>{shlex.quote(str(err))}"],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(REPO), TAG: tagged, "HOME": str(folder), **gate},
        text=True,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    if wait:
        _until_trial_0_finished(run, err)
    return run, err


def _until_trial_0_finished(run: subprocess.Popen[str], err: Path) -> None:
    deadline = time.monotonic() + 120
    while "trial 0:" not in (err.read_text() if err.exists() else ""):
        assert run.poll() is None, err.read_text()[-3000:]
        assert time.monotonic() < deadline, "trial 0 never finished"
        time.sleep(0.05)


def _ended_on_a_storage_fault(run: subprocess.Popen[str], err: Path, *fragments: str) -> str:
    if (err.parent / "gate").is_dir():
        (err.parent / "gate" / "open").touch()  # the fault is in place: trial 1 goes on
    run.communicate(timeout=120)
    said = err.read_text()
    assert "Traceback" not in said, said[-3000:]
    assert run.returncode == 2, f"exit {run.returncode}:\n{said[-3000:]}"
    line = said.strip().splitlines()[-1]
    assert line.startswith("autotune: error: study.yaml: storage "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def _resumes_to_the_budget(
    folder: Path, capsys: pytest.CaptureFixture[str], *args: str, budget: int = HELD_BUDGET
) -> None:
    """The same command, run again (in this process: no fork server, signal or kill to keep
    apart), ends at the budget with no trial left RUNNING."""
    with contextlib.chdir(folder):
        again = cli(capsys, "run", "study.yaml", "--quiet", *args)
    assert again.code == 0 and "Traceback" not in again.err, again.err[-3000:]
    trials = trials_of(folder, storage=_journal(folder) if "--storage" in args else None)
    assert finished(trials) == budget, [t.state.name for t in trials]
    assert not [t for t in trials if t.state.name == "RUNNING"]


def test_a_database_deleted_or_replaced_mid_run_is_saved_beside_it_and_resumes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """The run still holds the file open: the study as it was is written out beside it, and the
    line says where; a file put in its place is left as it is. Both runs start at once: each is
    held after trial 0 until its fault is in place."""
    runs = {}
    for how in ("deleted", "replaced"):
        (tmp_path / how).mkdir()
        runs[how] = _run_until_a_trial_finished(tmp_path / how, tag, wait=False)
    with ended_on_exit(*(run for run, _ in runs.values())):
        for how, (run, err) in runs.items():
            _until_trial_0_finished(run, err)
            database = tmp_path / how / "study.db"
            database.unlink()
            if how == "replaced":
                database.write_bytes(b"someone else's notes, not a database\n")
        for how, (run, err) in runs.items():
            folder = tmp_path / how
            database = folder / "study.db"
            with saying(how):
                line = _ended_on_a_storage_fault(
                    run,
                    err,
                    "deleted or replaced while the study ran",
                    "study.db.rescued-1",
                    "move it to",
                )
                rescued = folder / "study.db.rescued-1"
                kept = trials_of(folder, storage=f"sqlite:///{rescued}")
                assert finished([t for t in kept if t.state.name != "RUNNING"]) >= 1, line
                if how == "replaced":
                    assert database.read_bytes() == b"someone else's notes, not a database\n"
                rescued.replace(database)
                _resumes_to_the_budget(folder, capsys)


def test_a_journal_past_the_file_size_limit_is_one_line_and_resumes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """`ulimit -f 8`: the journal cannot grow past 8 KiB; the record cut short is mended by the
    next run, which (with the limit lifted) ends at the budget."""
    journal = "--storage", "journal:///study.journal"
    run, err = _run_until_a_trial_finished(
        tmp_path, tag, *journal, prefix="ulimit -f 8;", held=False
    )
    _ended_on_a_storage_fault(run, err, "size limit (ulimit -f)", "Raise the limit")
    _resumes_to_the_budget(tmp_path, capsys, *journal, budget=UNHELD_BUDGET)


def test_a_study_folder_made_unwritable_mid_run_is_one_line_and_resumes(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """`chmod 555` on the study's folder while it runs, as a user root's permissions do not
    override; the lock file it cannot then remove is left, and the next run takes it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs autotune as another user: needs root and setpriv")
    # outside pytest's folders, which only root may enter
    with tempfile.TemporaryDirectory(prefix="autotune-unwritable-") as name:
        folder = Path(name)
        shutil.chown(folder, "nobody")
        folder.chmod(0o755)
        run, err = _run_until_a_trial_finished(folder, tag, user="nobody")
        folder.chmod(0o555)
        try:
            _ended_on_a_storage_fault(run, err, "can no longer be written", "writable")
        finally:
            folder.chmod(0o755)
        _resumes_to_the_budget(folder, capsys)


# ---------------------------------------------------------------------------------------------
# Helpers a trial detaches from its process group


def test_helpers_a_trial_detaches_end_with_it_and_hold_no_pipe_open(
    tmp_path: Path,
    tag: str,  # noqa: F811 - the fixture
) -> None:
    """`autotune run ... | tee log` returns when the study ends: no helper of a trial (setsid, a
    double fork) is left holding its output open, nor running after it. Under isolation process
    and warm, a study each, run at once."""
    runs = {}
    for isolation in ("process", "warm"):
        folder = tmp_path / isolation
        folder.mkdir()
        (folder / "study.yaml").write_text(
            EASY.replace("tests.tasks:blobs", "tests.hostile.tasks:detaches_a_helper")
            + f"isolation: {isolation}\n"
        )
        runs[isolation] = spawn(folder, tag, "run", "study.yaml", "--quiet")
    with ended_on_exit(*runs.values()):
        for isolation, run in runs.items():
            try:
                out, err = run.communicate(timeout=150)  # to end-of-file on both pipes
            except subprocess.TimeoutExpired:
                pytest.fail(
                    f"{isolation}: autotune's output was still held open: {tagged_processes(tag)}"
                )
            with saying(isolation):
                assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
                assert finished(trials_of(tmp_path / isolation)) == 2
    assert_nothing_left(tag, within=2)


# ---------------------------------------------------------------------------------------------
# Trials on several devices where their processes cannot meet


def test_a_trial_on_two_devices_without_a_loopback_is_refused_at_once(tmp_path: Path) -> None:
    """`unshare -n`: a network namespace with its loopback down. The ranks would retry their
    rendezvous until the trial's timeout; the study is refused in one line instead."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -n is not allowed here")
    (tmp_path / "study.yaml").write_text(EASY + "devices_per_trial: 2\n")
    run = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "autotune", "run", "study.yaml"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == "", run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert lines[0].startswith("autotune: error: study.yaml: devices_per_trial: got 2;"), lines
    assert "127.0.0.1, which cannot be reached" in lines[0], lines
    assert not (tmp_path / "study.db").exists()


# ---------------------------------------------------------------------------------------------
# The newer keys and options, each wrong in one way: one line, exit 2, every file as it was

HEAD = "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.5}\n"
COMMAND = "task: {command: 'python train.py'}\ntarget: {metric: accuracy, value: 0.5}\n"
NEWER_KEYS = [
    ("confirm.runs Auto", "confirm: {top: 1, runs: Auto}\n", ("confirm.runs: got 'Auto'", "auto")),
    ("confirm.runs 1001", "confirm: {top: 1, runs: 1001}\n", ("confirm.runs: got 1001", "1000")),
    ("confirm.runs auto3", "confirm: {runs: auto3}\n", ("confirm.runs: got 'auto3'",)),
    ("confirm.runs a list", "confirm: {runs: [3, 8]}\n", ("confirm.runs: got [3, 8]",)),
    ("confirm.top negative", "confirm: {top: -1}\n", ("confirm.top: got -1",)),
    ("confirm unknown key", "confirm: {seeds: 3}\n", ("confirm.seeds", "accepted keys")),
    ("devices_per_trial 0", "devices_per_trial: 0\n", ("devices_per_trial: got 0", "1 to 64")),
    ("devices_per_trial 65", "devices_per_trial: 65\n", ("devices_per_trial: got 65",)),
    ("devices_per_trial 1.5", "devices_per_trial: 1.5\n", ("devices_per_trial: got 1.5",)),
    ("devices_per_trial two", "devices_per_trial: two\n", ("devices_per_trial: got 'two'",)),
    ("devices_per_trial true", "devices_per_trial: true\n", ("devices_per_trial: got True",)),
    (
        "ddp_bucket_cap_mb negative",
        "devices_per_trial: 2\nspace: {ddp_bucket_cap_mb: [-5, 25]}\n",
        ("space.ddp_bucket_cap_mb[0]: got -5", "at least 1"),
    ),
    (
        "ddp_bucket_cap_mb a word",
        "devices_per_trial: 2\nspace: {ddp_bucket_cap_mb: big}\n",
        ("space.ddp_bucket_cap_mb: got 'big'",),
    ),
    (
        "ddp_static_graph the string yes",
        "devices_per_trial: 2\nspace: {ddp_static_graph: 'yes'}\n",
        ("space.ddp_static_graph: got 'yes'", "true or false"),
    ),
    ("checkpointing 1.5", "space: {checkpointing: 1.5}\n", ("space.checkpointing: got 1.5",)),
    (
        "checkpointing -0.1",
        "space: {checkpointing: [-0.1, 0.5]}\n",
        ("space.checkpointing[0]: got -0.1", "fraction"),
    ),
    ("checkpointing half", "space: {checkpointing: half}\n", ("space.checkpointing: got 'half'",)),
    ("data_on_device maybe", "space: {data_on_device: maybe}\n", ("data_on_device: got 'maybe'",)),
    ("data_on_device empty", "space: {data_on_device: []}\n", ("data_on_device: got []", "empty")),
    ("baseline checkpointing 2", "baseline: {checkpointing: 2}\n", ("baseline.checkpointing",)),
    ("baseline data_on_device no", "baseline: {data_on_device: 'no'}\n", ("got 'no'",)),
    ("baseline learning_rate", "baseline: {learning_rate: 0.1}\n", ("baseline.learning_rate",)),
    ("baseline precision fp8", "baseline: {precision: fp8}\n", ("baseline.precision: got 'fp8'",)),
    ("baseline a list", "baseline: [0.1, 32]\n", ("baseline: got [0.1, 32]", "a mapping")),
    ("objective fastest", "objective: fastest\n", ("objective: got 'fastest'", "time_to_target")),
    ("first_trial 1", "first_trial: 1\n", ("first_trial: got 1", "prior")),
    ("prune median", "prune: median\n", ("prune: got 'median'", "incumbent")),
    (
        "goodput on two devices",
        "objective: goodput\ndevices_per_trial: 2\n",
        ("devices_per_trial: got 2", "timed from the probe's table"),
    ),
    ("eval_every negative", "budget: {eval_every: -0.5}\n", ("budget.eval_every: got -0.5",)),
    ("max_epochs zero", "budget: {max_epochs: 0}\n", ("budget.max_epochs: got 0",)),
    ("budget epochs", "budget: {epochs: 3}\n", ("budget.epochs", "did you mean 'max_epochs'?")),
    ("storage sqlite in memory", "storage: 'sqlite:///:memory:'\n", ("in-memory database",)),
    ("storage journal with no file", "storage: 'journal:///'\n", ("journal URL names its file",)),
    ("storage a plain path", "storage: study.sqlite\n", ("storage: got 'study.sqlite'", "URL")),
    ("storage https", "storage: 'https://example.com/db'\n", ("storage: got 'https://",)),
    (
        "storage with a NUL",
        'storage: "sqlite:///a\\0b.db"\n',
        ("storage: got 'sqlite:///a\\x00b.db'",),
    ),
    ("storage mysql not installed", "storage: 'mysql://localhost/db'\n", ("cannot open mysql://",)),
]
TARGET = "target: {metric: accuracy, value: 0.5}\n"
NEWER_COMMAND_KEYS = [
    ("command empty", "task: {command: ''}\n" + TARGET, ("task.command: got ''",)),
    (
        "command placeholder unknown",
        "task: {command: 'python t.py --w {width}'}\n" + TARGET,
        ("{width}",),
    ),
    ("command task without command", "task: {script: t.py}\n" + TARGET, ("task.script",)),
    ("command goodput", COMMAND + "objective: goodput\n", ("objective: got 'goodput'",)),
    (
        "command target direction",
        "task: {command: 'python t.py'}\ntarget: {metric: loss, value: 0.5, direction: down}\n",
        ("target.direction: got 'down'", "minimize (at or below)"),
    ),
]


@pytest.mark.parametrize(
    ("text", "fragments"),
    [(HEAD + case[1], case[2]) for case in NEWER_KEYS] + [case[1:] for case in NEWER_COMMAND_KEYS],
    ids=[case[0] for case in NEWER_KEYS + NEWER_COMMAND_KEYS],
)
def test_a_newer_key_wrong_in_one_way_is_one_line_and_touches_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    fragments: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(text)
    for script in ("t.py", "train.py"):  # the commands' scripts exist: the key is the mistake
        (tmp_path / script).write_text("")
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, "run", "study.yaml"), *fragments)
    assert_unchanged(before, tmp_path)


STORED_OPTIONS = [
    ("--workers 3 on SQLite", ["run", "study.yaml", "--workers", "3"], ("SQLite file",)),
    ("--storage with a NUL", ["run", "study.yaml", "--storage", "sqlite:///a\0b.db"], ("storage",)),
    ("study file a folder", ["run", "."], ("is a directory",)),
    ("study file /dev/null", ["report", "/dev/null"], ("character device",)),
    (
        "study file with a query",
        ["export", "study.yaml?x=1", "--format", "yaml"],
        ("no such file",),
    ),
    ("report --study with a file", ["report", "study.yaml", "--study", "x"], ("--study x",)),
    ("report --storage alone", ["report", "--storage", "sqlite:///study.db"], ("--study NAME",)),
    ("report --study alone", ["report", "--study", "study"], ("--storage URL",)),
    (
        "report a missing database",
        ["report", "--storage", "sqlite:///nosuch.db", "--study", "study"],
        ("no study database at nosuch.db",),
    ),
    ("report --csv in no folder", ["report", "study.yaml", "--csv", "no/t.csv"], ("--csv",)),
    ("report --html a folder", ["report", "study.yaml", "--html", "."], ("--html",)),
    (
        "report --tensorboard a file",
        ["report", "study.yaml", "--tensorboard", "study.yaml"],
        ("study.yaml",),
    ),
    (
        "report --csv - --html -",
        ["report", "study.yaml", "--csv", "-", "--html", "-"],
        ("would all write to standard output",),
    ),
    (
        "export -o the study file",
        ["export", "study.yaml", "--format", "yaml", "-o", "study.yaml"],
        ("that is the study file",),
    ),
    (
        "export -o the database's link",
        ["export", "study.yaml", "--format", "yaml", "-o", "db.link"],
        ("that is the study's storage", "write it elsewhere"),
    ),
    (
        "export -o the runner lock's name",
        ["export", "study.yaml", "--format", "yaml", "-o", "study.db.runner.lock"],
        ("write it elsewhere",),
    ),
    (
        "dashboard on a host of no address",
        ["dashboard", "study.yaml", "--host", "no.such.host.invalid"],
        ("cannot serve the dashboard",),
    ),
]


USAGE_ERRORS = [
    ("--workers 0", ["run", "study.yaml", "--workers", "0"], ("--workers", "at least 1")),
    ("--workers two", ["run", "study.yaml", "--workers", "two"], ("'two'",)),
    ("--trials 0", ["run", "study.yaml", "--trials", "0"], ("--trials", "'0'")),
    ("--trials 1e3", ["run", "study.yaml", "--trials", "1e3"], ("'1e3'",)),
    ("--timeout -1", ["run", "study.yaml", "--timeout", "-1"], ("--timeout", "'-1'")),
    ("--timeout nan", ["run", "study.yaml", "--timeout", "nan"], ("'nan'",)),
    ("--timeout inf", ["run", "study.yaml", "--timeout", "inf"], ("'inf'",)),
    ("export --format onnx", ["export", "study.yaml", "--format", "onnx"], ("'onnx'",)),
    ("export without --format", ["export", "study.yaml"], ("--format",)),
    ("dashboard --port 0", ["dashboard", "study.yaml", "--port", "0"], ("--port", "'0'")),
    ("dashboard --port 70000", ["dashboard", "study.yaml", "--port", "70000"], ("'70000'",)),
    ("dashboard --port abc", ["dashboard", "study.yaml", "--port", "abc"], ("'abc'",)),
    ("report --allow-changes", ["report", "study.yaml", "--allow-changes"], ("--allow-changes",)),
    ("export --quiet", ["export", "study.yaml", "--format", "yaml", "--quiet"], ("--quiet",)),
]


@pytest.mark.parametrize(
    ("args", "fragments", "usage"),
    [(*case[1:], False) for case in STORED_OPTIONS] + [(*case[1:], True) for case in USAGE_ERRORS],
    ids=[case[0] for case in STORED_OPTIONS + USAGE_ERRORS],
)
def test_a_wrong_option_beside_a_stored_study_is_one_line_or_its_usage_and_touches_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,  # noqa: F811 - the fixture
    args: list[str],
    fragments: tuple[str, ...],
    usage: bool,
) -> None:
    """A value the command checks: one line, exit 2; a value argparse refuses: its usage."""
    monkeypatch.chdir(tmp_path)
    place(tmp_path, stored)
    (tmp_path / "db.link").symlink_to("study.db")
    before = snapshot(tmp_path)
    (assert_usage_error if usage else assert_refused)(cli(capsys, *args), *fragments)
    assert_unchanged(before, tmp_path)


def test_report_and_export_read_a_sqlite_url_with_a_query_as_run_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,  # noqa: F811 - the fixture
) -> None:
    """`?timeout=5` on the URL: the same database, for report and export as for run."""
    monkeypatch.chdir(tmp_path)
    place(tmp_path, stored)
    for command in (["report"], ["export", "--format", "yaml"]):
        plain = cli(capsys, *command, "study.yaml")
        queried = cli(capsys, *command, "study.yaml", "--storage", "sqlite:///study.db?timeout=5")
        assert queried.code == plain.code == 0, queried.err
        assert queried.out == plain.out and queried.out
