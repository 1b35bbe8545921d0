"""Training tasks: what a trial trains (model, data, loss, metric), built-in or the user's own.

A task is a callable taking no arguments and returning a `Task`. A study file names it either
by a built-in name (`digits`, `mnist1d`, `shapes`, `paced`) or as `package.module:callable`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.errors import SpecError
from autotune.search.recipe import SGD_ARGS

BUILT_IN = {
    "digits": "autotune.train.tasks.digits:task",
    "mnist1d": "autotune.train.tasks.mnist1d:task",
    "shapes": "autotune.train.tasks.shapes:task",
    "paced": "autotune.train.tasks.paced:task",
}


def augmentation_rng(item: int | tuple[int, int]) -> tuple[int, torch.Generator | None]:
    """A training dataset's item split into its index and the generator its augmentation draws
    from. A dataset whose class sets `keyed = True` gets (index, key) from the trial's loader
    (loader.KeyedSampler), so a sample's augmentation follows from the run's seed alone, whichever
    loader worker prepares it; from any other loader it gets a plain index, and draws from torch's
    global random numbers (None) as a DataLoader seeds them per worker."""
    if isinstance(item, tuple):
        index, key = item
        return index, torch.Generator().manual_seed(key)
    return item, None


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of rows whose largest output is the target class."""
    return (outputs.argmax(dim=1) == targets).float().mean().item()


def sgd(
    params: Iterable[nn.Parameter], lr: float, *, fused: bool | None = None
) -> torch.optim.Optimizer:
    """SGD with Nesterov momentum (recipe.SGD_ARGS): the usual choice for small CNNs. `fused`:
    torch's fused step (the fused_optimizer knob); None, torch's default."""
    return torch.optim.SGD(params, lr=lr, fused=fused, **SGD_ARGS)


@dataclasses.dataclass(frozen=True)
class Task:
    """Everything a trial needs to train and evaluate one model.

    `metric(outputs, targets)` is computed once over the whole validation set (outputs of every
    batch concatenated) and higher is better; the study's target names it by `metric_name`.
    """

    # a fresh, freshly initialised model per call; takes the study's params by name
    model: Callable[..., nn.Module]
    train: Dataset
    val: Dataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    metric: Callable[[torch.Tensor, torch.Tensor], float] = accuracy
    metric_name: str = "accuracy"
    # (parameters, lr, **the study's params it names)
    optimizer: Callable[..., torch.optim.Optimizer] = sgd
    # The training set kept on the device (the data_on_device knob): called once a run with the
    # device, it copies the samples there and returns a function of (indices, keys), int64 tensors
    # on the CPU (keys None unless `train` is keyed), that returns those samples' batch on the
    # device, each sample as `train[(index, key)]` (or `train[index]`) gives it. None: a
    # TensorDataset's tensors are indexed on the device; any other dataset is not kept there.
    device_train: Callable[[torch.device], Callable[..., Any]] | None = None

    def unused(self, names: Iterable[str]) -> list[str]:
        """The study's parameters that neither the model factory nor the optimizer takes."""
        return [
            n
            for n in names
            if not takes(self.model, {n: None}) and not takes(self.optimizer, {n: None}, after=2)
        ]


def reference(function: Any) -> str | None:
    """`module:qualname` of a function or class, as a study file names a task; None for one that
    cannot be imported by that name (a lambda, a local function)."""
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    return f"{module}:{name}" if module and name and "<" not in name else None


def takes(
    function: Callable[..., Any], params: Mapping[str, Any], *, after: int = 0
) -> dict[str, Any]:
    """The parameters `function` accepts by keyword: those it names, or all with **kwargs.
    `after`: how many leading arguments the caller passes by position (they are not free).

    So a study's parameters reach whichever of the task's model factory and optimizer asks for
    them (width to the model, weight_decay to the optimizer) without either declaring the other's.
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins have none: hand them nothing
        return {}
    accepted = dict(list(signature.parameters.items())[after:])
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return dict(params)
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {k: v for k, v in params.items() if k in accepted and accepted[k].kind in keyword}


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
    except (Exception, SystemExit) as exc:
        # the user's module may fail in any way (sys.exit too); show its last line
        last = (str(exc).strip().splitlines() or [""])[-1]
        raise SpecError(
            study_path,
            "task",
            name,
            f"cannot be imported ({exc.__class__.__name__}: {last}); expected {accepted}",
        ) from None
    try:
        task = factory()
    except (Exception, SystemExit) as exc:
        last = (str(exc).strip().splitlines() or [""])[-1]
        raise SpecError(
            study_path, "task", name, f"failed while building ({exc.__class__.__name__}: {last})"
        ) from None
    if not isinstance(task, Task):
        raise SpecError(
            study_path,
            "task",
            name,
            f"returned {type(task).__name__}; a task callable returns autotune.Task",
        )
    return task


def _importable_from(*folders: Path) -> None:
    """Let `package.module:callable` name a module beside the study file or in the working folder.

    The `autotune` console script does not put either on sys.path by itself.
    """
    for folder in folders:
        if str(folder) not in sys.path:
            sys.path.append(str(folder))
