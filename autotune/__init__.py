"""autotune: find the fastest PyTorch training settings that reach your accuracy target."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.runners.protocol import report

if TYPE_CHECKING:
    from autotune.api import tune
    from autotune.record.summary import Summary
    from autotune.train.tasks import Task, accuracy, augmentation_rng

__version__ = "0.1.0"
__all__ = ["Summary", "Task", "accuracy", "augmentation_rng", "report", "tune", "__version__"]

# Imported when first used: a training script run by autotune imports it for `report` alone, and
# its import time is on the trial's clock, so it must not pay for torch here.
_LAZY = {
    "tune": "autotune.api",
    "Summary": "autotune.record.summary",
    "Task": "autotune.train.tasks",
    "accuracy": "autotune.train.tasks",
    "augmentation_rng": "autotune.train.tasks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
