"""Runs on several machines beginning one study on a database server at the same moment: a run that
finds another's probe under way waits for it; the first systems probe and throughput table stored
are those every run plans with; the first trials are queued once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml

from autotune import progress
from autotune.cli import main
from autotune.probe import run
from autotune.record import schema
from autotune.search.replay import sampled_values
from autotune.search.space import Choices, Range, Space
from autotune.storage import opening
from autotune.study import begin, goodput_table, probe_claim
from tests.study.test_study import REPO

# A study of the blobs task whose probe has one choice to make: the precision.
STUDY = {
    "task": "tests.tasks:blobs",
    "target": {"metric": "accuracy", "value": 0.9},
    "space": {
        "lr": {"low": 0.01, "high": 0.3, "log": True},
        "scheduler": "constant",
        "batch_size": 32,
        "accumulation_steps": 1,
        "num_workers": 0,
        "precision": ["fp32", "bf16"],
    },
    "budget": {"trials": 2, "max_epochs": 1, "eval_every": 0.5},
    "confirm": {"top": 0},
}


def told_it_waits(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the run has said it waits for another machine's figures: that machine then
    stores them, however slowly this machine reached its wait (no fixed time to guess)."""
    told = threading.Event()
    say = progress.say

    def said(message: str) -> None:
        say(message)
        if "is measuring this study's systems; this run waits" in message:
            told.set()

    monkeypatch.setattr(progress, "say", said)
    return told


def test_a_probe_stored_by_another_run_meanwhile_is_kept_and_planned_with(
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:blobs` imports
    monkeypatch.setattr(probe_claim, "CLAIM_SECONDS", 0.1)  # no other run writes a mark here
    path = tmp_path / "study.yaml"
    study_file = {**STUDY, "storage": postgres_url, "objective": "goodput"}  # a table stored too
    path.write_text(yaml.safe_dump(study_file))
    measure = run.run
    theirs: dict = {}
    their_table: dict = {}

    def measured_while_another_run_stored_its_own(*args, **kwargs) -> dict:
        ours = measure(*args, **kwargs)
        # the other machine's probe kept another precision; it stores its outcome as this one ends
        other = ["bf16"] if ours["precisions"] != ["bf16"] else ["fp32"]
        theirs.update(ours, precisions=other)
        schema.record_probe(optuna.load_study(study_name="study", storage=postgres_url), theirs)
        return ours

    def another_run_stores_its_table(tabulate):
        def tabulated(*args, **kwargs) -> dict | None:
            ours = tabulate(*args, **kwargs)
            if ours is not None:  # None: the probe's rates do not make a table
                their_table.update(ours, seconds=12.5)  # another machine's
                other = optuna.load_study(study_name="study", storage=postgres_url)
                schema.record_throughput(other, their_table)
            return ours

        return tabulated

    monkeypatch.setattr(run, "run", measured_while_another_run_stored_its_own)
    monkeypatch.setattr(
        goodput_table, "from_probe", another_run_stores_its_table(goodput_table.from_probe)
    )

    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    assert "another run of this study stored its systems probe first" in err, err
    study = optuna.load_study(study_name="study", storage=postgres_url)
    assert "another run of this study stored its throughput table first" in err, err
    assert schema.probe(study.user_attrs) == theirs
    assert schema.throughput(study.user_attrs) == their_table
    # the run planned with the stored probe: every trial trains its precision
    trials = study.get_trials(deepcopy=False)
    assert trials and {schema.trained_config(t)["precision"] for t in trials} == set(
        theirs["precisions"]
    )


def test_first_trials_queued_by_another_run_a_moment_ago_are_not_queued_again() -> None:
    space = Space(
        domains=(
            ("lr", Range(0.01, 0.3, log=True)),
            ("scheduler", Choices(("constant", "cosine", "onecycle"))),
            ("batch_size", Choices((16, 32, 64))),
            ("accumulation_steps", Range(1, 4)),
            ("precision", Choices(("fp32",))),
        ),
    )
    prepared = SimpleNamespace(
        baseline={
            "lr": 0.05,
            "scheduler": "constant",
            "batch_size": 16,
            "accumulation_steps": 1,
            "precision": "fp32",
        },
        train_samples=1024,
    )
    once, twice = optuna.create_study(), optuna.create_study()
    begin.enqueue_prior(once, space, prepared, trials=10)
    for _ in range(2):  # two runs, each past its check for a study without trials
        begin.enqueue_prior(twice, space, prepared, trials=10)
    assert len(queued(once)) > 1
    assert queued(twice) == queued(once)

    study = optuna.create_study()
    begin.enqueue_baseline(study, space, prepared.baseline)
    begin.enqueue_baseline(study, space, prepared.baseline)
    assert queued(study) == [sampled_values(space, prepared.baseline)]


def queued(study: optuna.Study) -> list[dict]:
    return [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]


def test_a_run_waits_for_another_machine_s_probe_and_probes_itself_once_its_mark_goes_stale(
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:blobs` imports
    monkeypatch.setattr(probe_claim, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(probe_claim, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(probe_claim, "STALE_SECONDS", 1.0)
    # the stale mark's run claims with no other run beside it: its claim need not wait long
    monkeypatch.setattr(probe_claim, "CLAIM_SECONDS", 0.1)
    told = told_it_waits(monkeypatch)
    study_file = {**STUDY, "storage": postgres_url, "budget": {"trials": 1, "max_epochs": 1}}

    def study_named(name: str) -> tuple[Path, optuna.Study]:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**study_file, "name": name}))
        # begun by another machine, which marked it as probing
        study = optuna.create_study(study_name=name, storage=postgres_url, direction="minimize")
        schema.record_probing(study, {"worker": "elsewhere:1", "at": 0.0})
        return path, study

    measure, probes, marks = run.run, [], []

    def probe_marked(*args, **kwargs) -> dict:
        began = time.time()
        outcome = measure(*args, **kwargs)
        # at least a few renewals long, however fast this machine measures
        time.sleep(3 * probe_claim.RENEW_SECONDS)
        marks.append((began, schema.probing(optuna.load_study(**names[-1]).user_attrs)))
        probes.append(outcome)
        return outcome

    monkeypatch.setattr(run, "run", probe_marked)
    names: list[dict] = []

    # a mark no one renews: its machine died; after STALE_SECONDS the run probes itself
    path, study = study_named("stale")
    names.append({"study_name": "stale", "storage": postgres_url})
    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    assert "elsewhere:1 stopped renewing its systems probe's mark; this run probes instead" in err
    assert len(probes) == 1 and schema.probe(study.user_attrs) == probes[0]
    began, mark = marks[0]
    # the mark was this process's while it probed, renewed as it went, and cleared after
    assert mark["worker"] == opening.worker_id() and mark["at"] > began
    assert schema.probing(study.user_attrs) == {}

    # a mark renewed: the run waits for that machine's figures and plans with them, measuring none
    path, study = study_named("live")
    stored = threading.Event()

    def elsewhere() -> None:
        # probing until this run waits for it (a minute at most: then the test fails, not
        # hangs), a few renewals more, then its outcome stored
        deadline = time.monotonic() + 60
        while not told.is_set() and time.monotonic() < deadline:
            schema.record_probing(study, {"worker": "elsewhere:1", "at": time.time()})
            time.sleep(0.1)
        for _ in range(3):
            schema.record_probing(study, {"worker": "elsewhere:1", "at": time.time()})
            time.sleep(0.1)
        schema.record_probe(study, probes[0])
        schema.record_probing(study, {})  # its measuring done
        stored.set()

    told.clear()  # the stale mark's run said it too, before that mark went stale
    other = threading.Thread(target=elsewhere)
    other.start()
    assert main(["run", str(path)]) == 0
    other.join()
    err = capsys.readouterr().err
    assert "elsewhere:1 is measuring this study's systems; this run waits for its figures" in err
    assert "stopped renewing" not in err
    assert stored.is_set() and len(probes) == 1  # no probe of its own
    trials = study.get_trials(deepcopy=False)
    assert trials and {schema.trained_config(t)["precision"] for t in trials} <= set(
        probes[0]["precisions"]
    )


def test_two_runs_that_find_no_mark_in_the_same_instant_measure_once(
    tmp_path: Path,
    postgres_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both write a mark and only the later write stands: the run whose mark was written over
    reads that back and waits for the other's figures rather than measure the same."""
    monkeypatch.chdir(REPO)  # so that `tests.tasks:blobs` imports
    monkeypatch.setattr(probe_claim, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(probe_claim, "RENEW_SECONDS", 0.2)
    told = told_it_waits(monkeypatch)
    study_file = {**STUDY, "storage": postgres_url, "budget": {"trials": 1, "max_epochs": 1}}
    measure, probes = run.run, []

    def counted(*args, **kwargs) -> dict:
        probes.append(measure(*args, **kwargs))
        return probes[-1]

    monkeypatch.setattr(run, "run", counted)

    def path_of(name: str) -> Path:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**study_file, "name": name}))
        return path

    assert main(["run", str(path_of("first"))]) == 0  # a probe for the other run to store
    assert len(probes) == 1
    capsys.readouterr()
    study = optuna.create_study(study_name="race", storage=postgres_url, direction="minimize")

    def elsewhere() -> None:
        # found no mark as this run did; its own lands just after this run's
        deadline = time.monotonic() + 60  # a run that never marks fails below, not hangs here
        while schema.probing(study.user_attrs).get("worker") != opening.worker_id():
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        # probing until this run waits for it, a few renewals more, then its outcome stored
        while not told.is_set() and time.monotonic() < deadline:
            schema.record_probing(study, {"worker": "elsewhere:1", "at": time.time()})
            time.sleep(0.1)
        for _ in range(3):
            schema.record_probing(study, {"worker": "elsewhere:1", "at": time.time()})
            time.sleep(0.1)
        schema.record_probe(study, probes[0])
        schema.record_probing(study, {})

    other = threading.Thread(target=elsewhere)
    other.start()
    assert main(["run", str(path_of("race"))]) == 0
    other.join()
    err = capsys.readouterr().err
    assert "elsewhere:1 is measuring this study's systems; this run waits for its figures" in err
    assert len(probes) == 1 and schema.probe(study.user_attrs) == probes[0]
    assert len(study.get_trials(deepcopy=False)) == 1
