"""Under `isolation: process` each trial has a fresh child, while the systems probe's measurements
share one, ended before the first trial; under `warm` the trials share one too, not the
measurements'."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import yaml

from autotune.runners import modes
from autotune.spec import study_file
from autotune.storage import opening
from autotune.study import preparation
from autotune.study.begin import begin
from tests.runners.test_isolation import CPU, LIMITS, REPO, config, still_alive
from tests.tasks import blobs


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports in the child


def process_id(_task: object, *, device: torch.device, seed: int) -> int:
    """A measurement that says which process took it."""
    return os.getpid()


def test_measurements_share_one_child_that_ends_when_told_and_each_trial_has_its_own() -> None:
    runners = modes.for_mode(
        "process", "tests.tasks:blobs", blobs(), study_path=REPO / "study.yaml", trial_timeout=60
    )
    measured = {runners.measure(process_id, device=CPU, seed=s) for s in range(3)}
    assert len(measured) == 1 and os.getpid() not in measured
    (child,) = measured
    runners.end_measuring()
    assert still_alive([child]) == []
    # a trial after it starts its own
    trained = runners.run_trial(config(32), limits=LIMITS, device=CPU, seed=1)
    assert trained.optimizer_steps > 0


def test_a_warm_study_s_trials_do_not_run_in_the_child_that_measured() -> None:
    """What the measurements left in their child (cuDNN's algorithms, compiled kernels) is no
    trial's to find: the warm child is replaced once they end, then serves trial after trial."""
    runners = modes.for_mode(
        "warm", "tests.tasks:blobs", blobs(), study_path=REPO / "study.yaml", trial_timeout=60
    )
    (measuring,) = {runners.measure(process_id, device=CPU, seed=s) for s in range(2)}
    kept = runners.run_trial.__self__
    assert kept.pid == measuring
    runners.end_measuring()
    assert kept.pid is None and still_alive([measuring]) == []
    pids = []
    for seed in range(2):
        runners.run_trial(config(32), limits=LIMITS, device=CPU, seed=seed)
        pids.append(kept.pid)
    assert len(set(pids)) == 1 and measuring not in pids
    kept.close()


def test_a_process_isolated_study_probes_in_one_child_and_ends_it_before_its_trials(
    tmp_path: Path,
) -> None:
    path = tmp_path / "probed.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": "tests.tasks:blobs",
                "target": {"metric": "accuracy", "value": 0.9},
                "space": {"batch_size": [16, 32], "num_workers": [0, 1], "precision": "fp32"},
                "budget": {"trials": 1, "max_epochs": 2, "max_seconds": 5, "eval_every": 0.5},
                "isolation": "process",
            }
        )
    )
    spec = study_file.load(path)
    prepared = preparation.prepare(spec)
    measuring = prepared.measure.__self__  # the measuring child
    pids = []

    def measure(*args, **kwargs):
        result = prepared.measure(*args, **kwargs)
        pids.append(measuring.pid)
        return result

    watched = dataclasses.replace(prepared, measure=measure)
    begin(spec, watched, opening.open_study(spec, create=True))
    assert len(pids) >= 2 and len(set(pids)) == 1  # every measurement in one child
    assert measuring.pid is None and still_alive(pids[:1]) == []  # gone before the trials
