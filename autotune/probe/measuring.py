"""What the probe reads of a prepared run (study/preparation.py's Prepared has it all): the task
it trains, the device, the space and baseline it chooses in, and where its measurements run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from autotune.runners.isolation import Measure
    from autotune.search.space import Space
    from autotune.train.tasks import Task


class Measuring(Protocol):
    """A prepared run as the probe reads it. Read-only: a frozen dataclass such as Prepared
    serves, and the probe narrows its space with dataclasses.replace."""

    @property
    def task(self) -> Task | None: ...  # None where autotune does not train the task

    @property
    def device(self) -> torch.device: ...

    @property
    def space(self) -> Space: ...

    @property
    def baseline(self) -> dict[str, Any]: ...

    @property
    def measure(self) -> Measure | None: ...  # runs a measurement here or in a child process

    @property
    def batch_norm(self) -> bool: ...  # the model's micro-batch is part of its maths
