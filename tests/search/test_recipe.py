"""The training recipe: the optimizer, LR schedules, loader and thread rules a trial trains by,
read by the training loop, the built-in tasks and every export (tests/export/test_export.py
checks that each export schedules as the trial does)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from autotune.search import recipe
from autotune.search.space import SCHEDULERS
from autotune.train import tasks, training


@pytest.mark.parametrize("total", [1, 2, 3, 4, 5, 6, 8, 100])
def test_each_schedule_is_sized_by_the_runs_optimizer_steps(total: int) -> None:
    """The rules as stated: step decays at 1/2 and 3/4 of the steps, cosine anneals over all of
    them, OneCycle warms up over a quarter but at least 1.5 steps, and 1 step keeps the peak lr."""

    def args(name: str) -> tuple[str, dict]:
        return recipe.scheduler_args(name, total_steps=total, lr=0.1)

    assert args("constant") == ("ConstantLR", {"factor": 1.0, "total_iters": 0})
    assert args("step") == (
        "MultiStepLR",
        {"gamma": 0.1, "milestones": [total // 2, total * 3 // 4]},
    )
    assert args("cosine") == ("CosineAnnealingLR", {"T_max": total})
    if total == 1:
        assert args("onecycle") == args("constant")
    else:
        assert args("onecycle") == (
            "OneCycleLR",
            {"total_steps": total, "max_lr": 0.1, "pct_start": max(0.25, 1.5 / total)},
        )


@pytest.mark.parametrize("total", range(2, 40))
def test_onecycle_warms_up_over_at_least_one_and_a_half_steps(total: int) -> None:
    """OneCycleLR ends its warm-up at step pct_start * total - 1 and divides by that: it must stay
    above 0 (0.5 from 1.5 steps), and a quarter of the steps once that is enough."""
    pct_start = recipe.onecycle_pct_start(total)
    assert pct_start * total - 1 >= 0.5 and pct_start <= 1
    assert (pct_start == 0.25) == (total >= 6)


@pytest.mark.parametrize("total", [1, 2, 5, 30])
@pytest.mark.parametrize("name", list(recipe.SCHEDULES))
def test_make_scheduler_builds_the_recipes_schedule(name: str, total: int) -> None:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = training.make_scheduler(name, optimizer, total_steps=total, lr=0.1)
    assert type(scheduler).__name__ == recipe.scheduler_args(name, total_steps=total, lr=0.1)[0]


def test_the_recipe_has_a_schedule_for_each_value_of_the_knob() -> None:
    assert tuple(recipe.SCHEDULES) == SCHEDULERS


def test_an_unknown_scheduler_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        ValueError,
        match="scheduler must be one of constant, step, cosine, onecycle, but got name='linear'",
    ):
        recipe.scheduler_args("linear", total_steps=10, lr=0.1)


def test_the_built_in_optimizer_is_sgd_with_the_recipes_arguments_under_its_recorded_name() -> None:
    assert tasks.Task.__dataclass_fields__["optimizer"].default is tasks.sgd
    assert tasks.reference(tasks.sgd) == recipe.BUILT_IN_OPTIMIZER
    group = tasks.sgd([nn.Parameter(torch.zeros(1))], 0.1).param_groups[0]
    assert {k: group[k] for k in recipe.SGD_ARGS} == recipe.SGD_ARGS and group["lr"] == 0.1


def test_loader_arguments_exist_only_where_workers_do() -> None:
    knobs = {"batch_size": 32, "num_workers": 0, "prefetch_factor": None, "pin_memory": False}
    assert recipe.loader_kwargs(knobs) == {
        "batch_size": 32,
        "shuffle": True,
        "drop_last": True,
        "num_workers": 0,
        "persistent_workers": False,
        "pin_memory": False,
    }
    workers = recipe.loader_kwargs(
        {**knobs, "num_workers": 2, "prefetch_factor": 4, "pin_memory": True}
    )
    assert (
        workers["prefetch_factor"] == 4 and workers["persistent_workers"] and workers["pin_memory"]
    )


def test_training_takes_the_cores_the_loader_workers_leave() -> None:
    assert [recipe.training_threads(4, workers) for workers in (0, 1, 3, 4, 9)] == [4, 3, 1, 1, 1]
    # a trial's ranks share the cores: each an equal part of what their workers leave
    assert [recipe.training_threads(8, 1, processes=n) for n in (1, 2, 3, 8)] == [7, 3, 1, 1]


def test_the_recipe_and_the_exports_import_no_torch() -> None:
    """Exports read the recipe without paying for torch."""
    code = (
        "import sys, autotune.search.recipe, autotune.export; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch'], 'torch imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
