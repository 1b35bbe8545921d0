"""The confusion matrix of one evaluation of a classifier; what it says per class is
record/classes.py's."""

from __future__ import annotations

import torch

MAX_CLASSES = 1000  # beyond this a per-class table is no report; the matrix is not kept


def confusion(outputs: torch.Tensor, targets: torch.Tensor) -> list[list[int]] | None:
    """Row = true class, column = predicted class (the largest output); None when the outputs are
    not one score per class for integer class targets (regression, segmentation, multi-label)."""
    if (
        outputs.ndim != 2
        or targets.ndim != 1
        or targets.dtype.is_floating_point
        or targets.dtype == torch.bool
    ):
        return None
    classes = outputs.shape[1]
    if not 2 <= classes <= MAX_CLASSES or len(targets) != len(outputs):
        return None
    if len(targets) and (targets.min() < 0 or targets.max() >= classes):
        return None
    predicted = outputs.argmax(dim=1)
    counts = torch.bincount(targets.long() * classes + predicted, minlength=classes * classes)
    return counts.reshape(classes, classes).tolist()
