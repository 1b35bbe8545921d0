"""first_trial: prior: a new study's first trials take a larger batch, the baseline's lr scaled to
it and a schedule that ends, each value inside the space; the sampler chooses the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.errors import SpecError
from autotune.record import schema
from autotune.search import prior
from autotune.search.replay import sampled_values
from autotune.search.space import Choices, Range, Space, middle
from autotune.spec.study_file import from_mapping
from tests.study.test_study import REPO, load, run_cli, write_study

SPACE = Space(
    domains=(
        ("lr", Range(0.001, 1.0, log=True)),
        ("scheduler", Choices(("constant", "step", "cosine", "onecycle"))),
        ("batch_size", Choices((16, 32, 64, 128, 256))),
        ("accumulation_steps", Range(1, 4)),
        ("num_workers", Choices((0, 2))),
        ("prefetch_factor", Choices((2, 4))),
        ("precision", Choices(("fp32", "bf16"))),
        ("schedule_epochs", Range(1.0, 4.0)),
    ),
    params=(("width", Range(8, 64)),),
)
BASELINE = {
    "lr": 0.01,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "num_workers": 0,
    "prefetch_factor": None,
    "precision": "fp32",
    "schedule_epochs": 4.0,
    "width": 32,
}


def inside(space: Space, trial: dict[str, Any]) -> bool:
    """The partial trial's values, completed by values inside the space, make a configuration of the
    space."""
    config = {name: middle(name, domain) for name, domain in (*space.domains, *space.params)}
    config.update(trial)
    if config["num_workers"] == 0:
        config["prefetch_factor"] = None
    return sampled_values(space, config) is not None


def test_the_prior_is_the_largest_batch_with_enough_steps_the_scaled_lr_spread_and_onecycle() -> (
    None
):
    # 2048 samples: batch 64 leaves 32 steps an epoch, 128 only 16 (fewer than MIN_STEPS = 20)
    trials = prior.first_trials(SPACE, BASELINE, train_samples=2048, count=3)
    assert [{k: v for k, v in t.items() if k != "lr"} for t in trials] == [
        {"batch_size": 64, "accumulation_steps": 1, "scheduler": "onecycle"}
    ] * 3
    # linear scaling: 0.01 x 64 / 32, then a third and three times that
    assert [t["lr"] for t in trials] == pytest.approx([0.02, 0.02 / 3, 0.06])
    # and precision, systems knobs, schedule, width left to the sampler
    assert all(inside(SPACE, t) for t in trials)


def test_the_lr_scales_with_the_effective_batch_of_the_baseline() -> None:
    # effective 64, as the prior's
    baseline = {
        **BASELINE,
        "batch_size": 16,
        "accumulation_steps": 4,
    }
    assert prior.first_trials(SPACE, baseline, train_samples=2048, count=1)[0][
        "lr"
    ] == pytest.approx(0.01)


@pytest.mark.parametrize("count", [0, 1, 2])
def test_no_more_trials_than_asked(count: int) -> None:
    assert len(prior.first_trials(SPACE, BASELINE, train_samples=2048, count=count)) == count


def test_a_fixed_lr_is_left_out_and_the_trials_that_become_alike_are_one() -> None:
    space = SPACE.replace("lr", Choices((0.1,)))
    assert prior.first_trials(space, BASELINE, train_samples=2048, count=3) == [
        {"batch_size": 64, "accumulation_steps": 1, "scheduler": "onecycle"}
    ]


def test_a_one_value_batch_list_is_left_out_and_the_lr_scales_with_it() -> None:
    space = SPACE.replace("batch_size", Choices((128,)))
    trials = prior.first_trials(space, BASELINE, train_samples=2048, count=3)
    assert all("batch_size" not in t and inside(space, t) for t in trials)
    assert trials[0]["lr"] == pytest.approx(0.04)  # 0.01 x 128 / 32


def test_integer_ranges_give_whole_numbers_at_the_smallest_accumulation() -> None:
    space = SPACE.replace("batch_size", Range(8, 100)).replace("accumulation_steps", Range(2, 5))
    trials = prior.first_trials(space, {**BASELINE, "batch_size": 16}, train_samples=1000, count=3)
    # at 2 accumulation steps an epoch has 1000 / 2 / batch optimizer steps: at least 20 up to batch
    # 25
    assert {(t["batch_size"], t["accumulation_steps"]) for t in trials} == {(25, 2)}
    assert all(
        type(t["batch_size"]) is int and type(t["accumulation_steps"]) is int for t in trials
    )
    assert trials[0]["lr"] == pytest.approx(0.01 * 50 / 16)
    assert all(inside(space, t) for t in trials)


@pytest.mark.parametrize(
    "schedulers, chosen",
    [(("constant", "cosine"), "cosine"), (("constant", "step"), None), (("onecycle",), None)],
)
def test_onecycle_else_cosine_else_the_sampler_chooses(
    schedulers: tuple[str, ...], chosen: str | None
) -> None:
    space = SPACE.replace("scheduler", Choices(schedulers))
    trials = prior.first_trials(space, BASELINE, train_samples=2048, count=3)
    assert [t.get("scheduler") for t in trials] == [chosen] * 3  # a fixed onecycle is fixed anyway
    assert all(inside(space, t) for t in trials)


@pytest.mark.parametrize(
    "lr, domain, expected",
    [
        # every spread value past the range: one trial at its top
        (
            10.0,
            Range(0.001, 0.1, log=True),
            [0.1],
        ),
        (1e-6, Range(0.001, 0.1, log=True), [0.001]),
        (0.05, Range(0.001, 0.1, log=True), [0.1, 0.1 / 3]),  # x3 clamped onto x1
        # the nearest choice on a log scale to 0.02, 0.0067, 0.06
        (
            0.01,
            Choices((0.001, 0.01, 0.1)),
            [0.01, 0.1],
        ),
        (0.03, Choices((0.001, 0.01, 0.1)), [0.1, 0.01]),  # to 0.06, 0.02, 0.18
    ],
)
def test_an_lr_outside_the_domain_is_clamped_into_it(
    lr: float, domain: Any, expected: list[float]
) -> None:
    space = SPACE.replace("lr", domain)
    trials = prior.first_trials(space, {**BASELINE, "lr": lr}, train_samples=2048, count=3)
    assert [t["lr"] for t in trials] == pytest.approx(expected)
    assert all(inside(space, t) for t in trials)


@pytest.mark.parametrize(
    "samples, batches, expected",
    [
        (700, (16, 32, 64, 128), 32),  # 64 would leave 10 steps an epoch
        (100, (16, 32, 64, 128), 32),  # none leaves 20 steps: the baseline's batch
        # nor here, and the baseline's is not in the space: the nearest that is
        (
            100,
            (64, 128, 256),
            64,
        ),
        (None, (16, 32, 64, 128), 32),  # a command task's training set is unknown
    ],
)
def test_a_training_set_too_small_for_the_larger_batches_keeps_a_smaller_one(
    samples: int | None, batches: tuple[int, ...], expected: int
) -> None:
    space = SPACE.replace("batch_size", Choices(batches))
    trials = prior.first_trials(space, BASELINE, train_samples=samples, count=3)
    assert {t["batch_size"] for t in trials} == {expected}
    assert all(inside(space, t) for t in trials)


def test_the_study_file_takes_prior_and_says_so_for_other_values() -> None:
    study = {"task": "digits", "target": {"metric": "accuracy", "value": 0.9}}
    assert (
        from_mapping({**study, "first_trial": "prior"}, path=Path("s.yaml")).first_trial == "prior"
    )
    with pytest.raises(SpecError, match="prior"):
        from_mapping({**study, "first_trial": "priors"}, path=Path("s.yaml"))


def test_a_new_study_starts_with_the_prior_trials_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:blobs` imports
    path = write_study(tmp_path, trials=2, confirm={"top": 1, "runs": 1})
    study = yaml.safe_load(path.read_text())
    study["space"]["scheduler"] = ["constant", "cosine", "onecycle"]
    study.update(first_trial="prior", baseline={"lr": 0.05, "batch_size": 16})
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    assert run_cli("run", str(path), capsys=capsys)[0] == 0
    trials = load(path).trials
    # 1024 training samples: batch 32 leaves 32 steps an epoch, 64 only 16; lr 0.05 x 32 / 16, then
    # a third of it (a budget of 2 trials has room for 2 prior trials)
    assert [schema.queue_marks(t) for t in trials] == [{schema.PRIOR: True}] * 2
    assert [
        (t.params["batch_size"], t.params["accumulation_steps"], t.params["scheduler"])
        for t in trials
    ] == [(32, 1, "onecycle")] * 2
    assert [t.params["lr"] for t in trials] == pytest.approx([0.1, 0.1 / 3])
    assert [schema.trained_config(t)["batch_size"] for t in trials] == [32, 32]  # and trained so

    # resumed: nothing queued again
    assert run_cli("run", str(path), "--trials", "3", capsys=capsys)[0] == 0
    trials = load(path).trials
    assert len(trials) == 3 and [t.number for t in trials if schema.queue_marks(t)] == [0, 1]
