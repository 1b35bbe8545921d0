"""The built-in tasks: real data, offline, and the shapes the trial runner relies on."""

from __future__ import annotations

import pytest
import torch

from autotune.errors import SpecError
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import BUILT_IN, Task, load_task
from autotune.train.trial import run


@pytest.fixture(scope="module")
def digits() -> Task:
    return load_task("digits")


def test_digits_is_split_and_augments_only_training_samples(digits: Task) -> None:
    assert len(digits.train) + len(digits.val) == 1797 and len(digits.val) == 359
    image, label = digits.train[0]
    assert image.shape == (1, 16, 16) and 0 <= int(label) < 10
    # a fresh random affine each time
    assert not torch.equal(digits.train[0][0], digits.train[0][0])
    assert torch.equal(digits.val[0][0], digits.val[0][0])
    assert digits.model()(image[None]).shape == (1, 10)


def test_digits_baseline_learns(digits: Task) -> None:
    config = TrialConfig(
        lr=0.05,
        scheduler="constant",
        batch_size=64,
        accumulation_steps=1,
        num_workers=0,
        prefetch_factor=None,
        pin_memory=False,
        precision="fp32",
    )
    result = run(
        digits,
        config,
        limits=Limits(target=0.9, max_epochs=6, max_seconds=60, eval_every=0.5),
        device=torch.device("cpu"),
        seed=0,
    )
    assert result.reached and result.curve[0][2] < result.best_metric


def test_mnist1d_is_generated_locally_not_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import requests

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("mnist1d tried to download")

    monkeypatch.setattr(requests, "get", no_network)
    task = load_task("mnist1d")
    assert len(task.train) == 4000 and len(task.val) == 1000
    signal, _ = task.train[0]
    assert signal.shape == (40,) and task.model()(signal[None]).shape == (1, 10)


def test_close_misspelling_of_a_built_in_is_suggested() -> None:
    with pytest.raises(SpecError, match="did you mean 'digits'"):
        load_task("digit", study_path="s.yaml")
    with pytest.raises(SpecError, match="did you mean 'shapes'"):
        load_task("shape", study_path="s.yaml")
    assert set(BUILT_IN) == {"digits", "mnist1d", "shapes", "paced"}


def test_a_callable_that_returns_something_else_is_refused(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not_a_task.py").write_text("def task():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="returned int; a task callable returns autotune.Task"):
        load_task("not_a_task:task", study_path=tmp_path / "s.yaml")
