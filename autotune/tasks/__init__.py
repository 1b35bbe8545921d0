"""Training tasks: what a trial trains (model, data, loss, metric), built-in or the user's own.

A task is a callable taking no arguments and returning a `Task`. A study file names it either
by a built-in name (`digits`, `mnist1d`) or as `package.module:callable`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.errors import SpecError

BUILT_IN = {
    "digits": "autotune.tasks.digits:task",
    "mnist1d": "autotune.tasks.mnist1d:task",
}


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of rows whose largest output is the target class."""
    return (outputs.argmax(dim=1) == targets).float().mean().item()


def sgd(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum: the usual choice for small CNNs."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything a trial needs to train and evaluate one model.

    `metric(outputs, targets)` is computed once over the whole validation set (outputs of every
    batch concatenated) and higher is better; the study's target names it by `metric_name`.
    """

    model: Callable[[], nn.Module]  # a fresh, freshly initialised model per call
    train: Dataset
    val: Dataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    metric: Callable[[torch.Tensor, torch.Tensor], float] = accuracy
    metric_name: str = "accuracy"
    optimizer: Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer] = sgd


def load_task(name: str, *, study_path: Path | str = "study") -> Task:
    """Import and build the task a study file names; errors name the file and the `task` key."""
    _importable_from(Path.cwd(), Path(study_path).resolve().parent)
    reference = BUILT_IN.get(name, name)
    module_name, _, attr = reference.partition(":")
    accepted = f"a built-in task ({', '.join(BUILT_IN)}) or package.module:callable"
    if not attr or not module_name:
        close = difflib.get_close_matches(name, BUILT_IN, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise SpecError(study_path, "task", name, f"unknown task; {hint}expected {accepted}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # the user's module may fail in any way; show its last line
        last = (str(exc).strip().splitlines() or [""])[-1]
        raise SpecError(study_path, "task", name, f"cannot be imported ({exc.__class__.__name__}: {last}); expected {accepted}") from None
    try:
        task = factory()
    except Exception as exc:
        last = (str(exc).strip().splitlines() or [""])[-1]
        raise SpecError(study_path, "task", name, f"failed while building ({exc.__class__.__name__}: {last})") from None
    if not isinstance(task, Task):
        raise SpecError(study_path, "task", name, f"returned {type(task).__name__}; a task callable returns autotune.Task")
    return task


def _importable_from(*folders: Path) -> None:
    """Let `package.module:callable` name a module beside the study file or in the working folder.

    The `autotune` console script does not put either on sys.path by itself.
    """
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
