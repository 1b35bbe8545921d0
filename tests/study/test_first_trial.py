"""first_trial: baseline: a new study's first trial is the user's baseline, so the search starts
there."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune.record import derived, schema
from autotune.search.replay import sampled_values
from autotune.search.space import Choices, Range, Space, complete, suggest
from tests.study.test_study import in_repo, load, run_cli, write_study  # noqa: F401 (in_repo: a fixture)

SPACE = Space(
    domains=(
        ("lr", Range(0.01, 0.3, log=True)),
        ("scheduler", Choices(("constant", "cosine"))),
        ("batch_size", Choices((16, 32, 64))),
        ("accumulation_steps", Range(1, 4)),
        ("num_workers", Choices((0, 2))),
        ("prefetch_factor", Choices((2, 4))),
        ("precision", Choices(("fp32",))),
    ),
    params=(("width", Range(8, 64)),),
)
CONFIG = {
    "lr": 0.05,
    "scheduler": "cosine",
    "batch_size": 32,
    "accumulation_steps": 2,
    "num_workers": 0,
    "prefetch_factor": None,
    "precision": "fp32",
    "width": 16,
}


def test_the_values_a_sampler_would_choose_give_back_the_configuration() -> None:
    values = sampled_values(SPACE, CONFIG)
    # no prefetch_factor without workers; the fixed precision is not chosen
    assert values == {
        "lr": 0.05,
        "scheduler": "cosine",
        "batch_size": 32,
        "accumulation_steps": 2,
        "num_workers": 0,
        "width": 16,
    }
    assert suggest(SPACE, optuna.trial.FixedTrial(values)) == CONFIG
    with_workers = {**CONFIG, "num_workers": 2, "prefetch_factor": 4}
    assert sampled_values(SPACE, with_workers)["prefetch_factor"] == 4


@pytest.mark.parametrize(
    "change",
    [
        {"lr": 0.5},  # past the range
        {"batch_size": 48},  # not a choice
        {"accumulation_steps": 2.5},  # a whole number's range
        {"precision": "bf16"},  # a fixed knob with another value
        {"scheduler": True},  # of another type than every choice
        {"width": 100},  # a parameter past its range
    ],
)
def test_a_configuration_outside_the_space_has_no_such_values(change: dict) -> None:
    assert sampled_values(SPACE, {**CONFIG, **change}) is None


def with_first_trial(path: Path, **extra: object) -> Path:
    study = yaml.safe_load(path.read_text())
    study.update(first_trial="baseline", **extra)
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_a_new_study_starts_with_its_baseline_as_trial_0_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = with_first_trial(
        write_study(tmp_path, trials=3, confirm={"top": 3, "runs": 1}),
        baseline={"lr": 0.05, "batch_size": 64},
    )
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    # the user is told which it is
    assert "trial 0 (the baseline): " in err and "trial 1 (the baseline)" not in err
    study = load(path)
    first = study.trials[0]
    # in the table of the fastest, too
    assert derived.is_feasible(first) and "\n0 (baseline) " in out
    assert schema.is_baseline(first) and first.state.name == "COMPLETE"
    confirmation = schema.confirmation(study.user_attrs)
    baseline = confirmation["configs"]["baseline"]
    assert (
        complete(schema.trained_config(first)) == complete(baseline)
        and baseline["lr"] == 0.05
        and baseline["batch_size"] == 64
    )
    assert [t.number for t in study.trials if schema.is_baseline(t)] == [0]
    # measured once, as the baseline, though trial 0 is among the fastest it confirms
    assert 0 in confirmation["trials"] and "trial 0" not in confirmation["configs"]

    code, _, _ = run_cli("run", str(path), "--trials", "4", capsys=capsys)
    assert code == 0
    study = load(path)
    assert len(study.trials) == 4 and [t.number for t in study.trials if schema.is_baseline(t)] == [
        0
    ]


def test_a_baseline_outside_the_space_is_not_a_trial_and_the_study_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = with_first_trial(
        write_study(tmp_path, trials=2, confirm={"top": 1, "runs": 1}), baseline={"batch_size": 8}
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0 and "the baseline lies outside the search space" in err
    assert not any(schema.is_baseline(t) for t in load(path).trials)
