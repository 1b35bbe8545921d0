"""autotune: find the fastest PyTorch training settings that reach your accuracy target."""

from autotune.tasks import Task, accuracy

__version__ = "0.1.0"
__all__ = ["Task", "accuracy", "__version__"]
