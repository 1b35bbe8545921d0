"""autotune: find the fastest PyTorch training settings that reach your accuracy target."""

from autotune.api import tune
from autotune.reporting import report
from autotune.tasks import Task, accuracy

__version__ = "0.1.0"
__all__ = ["Task", "accuracy", "report", "tune", "__version__"]
