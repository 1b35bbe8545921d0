"""Activation checkpointing (autotune.train.checkpointing): the same training with less kept for the
backward pass, a batch that ran out of memory fitting, and the models that cannot opt in."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from autotune.search.space import DEFAULT_BASELINE, Choices, complete
from autotune.spec.study_file import load
from autotune.study import preparation
from autotune.train import checkpointing, oom, systems, training, trial
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import digits, shapes
from tests.tasks import ActivationBudgetNet, SavedBytes, activation_budget

CPU = torch.device("cpu")
LIMITS = Limits(target=2.0, max_epochs=1, max_seconds=60, eval_every=1.0)  # one epoch


def config(**knobs: object) -> TrialConfig:
    return TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, **knobs}))


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """Steps of SGD with momentum on `batches`, as a trial takes them; the losses."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return [
        float(
            training.train_step(
                model,
                [batch],
                loss_fn=F.cross_entropy,
                optimizer=optimizer,
                scaler=scaler,
                autocast=lambda: torch.autocast("cpu", enabled=False),
                device=CPU,
                non_blocking=False,
            )
        )
        for batch in batches
    ]


@pytest.mark.parametrize(
    "make, shape",
    [
        (shapes.small_model, (3, 32, 32)),
        (digits.SmallCNN, (1, 16, 16)),
        (ActivationBudgetNet, (8,)),
    ],
    ids=["shapes ResNet-9", "digits CNN", "residual MLP"],
)
@pytest.mark.parametrize("value", [True, 0.5])
def test_checkpointing_trains_the_same_parameters_and_batchnorm_statistics(
    make: type[nn.Module], shape: tuple[int, ...], value: bool | float
) -> None:
    """k steps with and without checkpointing from the same seed: the same losses, parameters and
    running statistics (the recomputation must not update BatchNorm's a second time)."""
    torch.manual_seed(0)
    plain = make()
    checked = checkpointing.apply(copy.deepcopy(plain), value)
    assert len(checkpointing.checkpointed(checked)) == checkpointing.count(
        value, len(checkpointing.blocks(checked))
    )
    generator = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(8, *shape, generator=generator),
            torch.randint(0, 4, (8,), generator=generator),
        )
        for _ in range(3)
    ]
    assert train(checked, batches) == pytest.approx(train(plain, batches), rel=1e-5)
    for (name, mine), theirs in zip(checked.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(mine, theirs, msg=name)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), make().state_dict().values())
    )


@pytest.mark.parametrize(
    "make, shape", [(shapes.small_model, (3, 32, 32)), (digits.SmallCNN, (1, 16, 16))]
)
def test_checkpointing_keeps_fewer_bytes_for_the_backward_pass(
    make: type[nn.Module], shape: tuple[int, ...]
) -> None:
    """The tensors autograd keeps during a forward pass: fewer bytes with half the blocks
    checkpointed, fewer again with all of them."""
    kept = {}
    for value in (False, 0.5, True):
        torch.manual_seed(0)
        model = checkpointing.apply(make(), value)
        with SavedBytes(model) as saved:
            loss = F.cross_entropy(
                model(torch.randn(16, *shape)), torch.zeros(16, dtype=torch.long)
            )
        loss.backward()
        kept[value] = saved.bytes
    assert kept[False] > kept[0.5] > kept[True] > 0


def test_a_batch_that_ran_out_of_memory_fits_with_checkpointing() -> None:
    """ActivationBudgetNet at a batch of 128 runs out (really: its forward pass raises
    torch.cuda.OutOfMemoryError past its budget); checkpointed, the same trial trains."""
    task = activation_budget()
    with pytest.raises(torch.cuda.OutOfMemoryError) as error:
        trial.run(task, config(batch_size=128), limits=LIMITS, device=CPU, seed=0)
    assert oom.is_oom(error.value)
    trial.run(task, config(batch_size=64), limits=LIMITS, device=CPU, seed=0)  # a smaller one fits
    result = trial.run(
        task, config(batch_size=128, checkpointing=True), limits=LIMITS, device=CPU, seed=0
    )
    assert result.optimizer_steps == 1024 // 128 and result.stop_reason == "max_epochs"


def test_evaluation_runs_the_blocks_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without gradients nothing is kept for a backward pass: the blocks run as they are."""
    calls = []

    def noting(function, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(function)
        return function(*args)

    monkeypatch.setattr(checkpointing, "checkpoint", noting)
    model = checkpointing.apply(ActivationBudgetNet(), True)
    with torch.no_grad():
        model(torch.randn(4, 8))
    assert calls == []
    model.eval()(torch.randn(4, 8))  # gradients on: a backward pass may follow
    assert len(calls) == len(model.blocks)


def test_count_takes_the_first_share_of_the_blocks_at_least_one() -> None:
    assert [checkpointing.count(v, 10) for v in (False, 0.05, 0.3, 0.5, True)] == [0, 1, 3, 5, 10]
    assert checkpointing.count(0.5, 3) == 2 and checkpointing.count(True, 6) == 6


def test_applying_twice_checkpoints_no_block_twice_and_a_copy_checkpoints_its_own() -> None:
    model = checkpointing.apply(ActivationBudgetNet(), 0.5)
    checkpointing.apply(model, 0.5)
    blocks = checkpointing.checkpointed(model)
    assert blocks == list(model.blocks)[:3]
    assert all(block.forward.block is block for block in blocks)
    twin = copy.deepcopy(model)
    assert [b.forward.block for b in checkpointing.checkpointed(twin)] == list(twin.blocks)[:3]


class NoHook(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 4)


class EmptyHook(NoHook):
    def checkpoint_blocks(self) -> list[nn.Module]:
        return []


def test_a_model_without_blocks_to_checkpoint_says_why() -> None:
    assert checkpointing.problem(ActivationBudgetNet()) is None
    assert checkpointing.problem(shapes.small_model()) is None
    assert "defines no checkpoint_blocks()" in checkpointing.problem(NoHook())
    assert "returned no sequence of nn.Module blocks" in checkpointing.problem(EmptyHook())
    with pytest.raises(ValueError, match="defines no checkpoint_blocks"):
        checkpointing.apply(NoHook(), True)
    model = NoHook()
    assert checkpointing.apply(model, False) is model  # off: nothing asked of the model


def test_prepare_model_checkpoints_before_it_lays_out_and_compiles() -> None:
    model, evaluated = systems.prepare_model(
        shapes.small_model(), channels_last=True, compile=False, checkpointing=True
    )
    assert model is evaluated and len(checkpointing.checkpointed(model)) == 6


def test_prepare_fixes_checkpointing_off_with_one_notice_for_a_model_without_the_hook(
    tmp_path: Path,
) -> None:
    head = "target: {metric: accuracy, value: 0.9}\ndevice: cpu\n"
    path = tmp_path / "study.yaml"
    path.write_text("task: tests.tasks:blobs\n" + head)
    prepared = preparation.prepare(load(path))
    assert prepared.space["checkpointing"] == Choices((False,))
    notices = [n for n in prepared.notices if n.startswith("checkpointing")]
    assert notices == [
        "checkpointing fixed to false: the task's model defines no checkpoint_blocks() method "
        "naming its blocks"
    ]
    path.write_text(
        "task: tests.tasks:activation_budget\n" + head + "baseline: {checkpointing: 0.5}\n"
    )
    prepared = preparation.prepare(load(path))
    assert prepared.baseline["checkpointing"] == 0.5
    # a model with the hook: on CPU the choice is fixed off for the device, not for the model
    assert prepared.space["checkpointing"] == Choices((False,))
    notices = [n for n in prepared.notices if n.startswith("checkpointing")]
    assert len(notices) == 1 and "recomputing activations only costs time" in notices[0]


def test_the_trial_config_carries_the_share() -> None:
    assert config().checkpointing is False
    assert dataclasses.replace(config(), checkpointing=0.5).as_dict()["checkpointing"] == 0.5
    assert (
        TrialConfig.from_mapping({**DEFAULT_BASELINE, "checkpointing": None}).checkpointing is False
    )
