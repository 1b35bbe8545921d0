"""Per-class figures of a classifier from its confusion matrices (train/class_figures.py):
precision, recall and F1 per class, and summed matrices that pool several runs on the same
validation set."""

from __future__ import annotations

from collections.abc import Sequence


def add(matrices: Sequence[Sequence[Sequence[int]]]) -> list[list[int]] | None:
    """The element-wise sum of same-shaped matrices; None for none or for mismatched shapes."""
    if not matrices or len({(len(m), len(m[0]) if m else 0) for m in matrices}) != 1:
        return None
    return [
        [sum(m[i][j] for m in matrices) for j in range(len(matrices[0][i]))]
        for i in range(len(matrices[0]))
    ]


def per_class(matrix: Sequence[Sequence[int]]) -> list[dict[str, float | int | None]]:
    """Precision, recall, F1 and support of each class. A figure whose denominator is 0 (a class
    never predicted, or absent from the validation set) is None, not 0: it was not measured."""
    rows = []
    for k, row in enumerate(matrix):
        true_positive = row[k]
        support = sum(row)
        predicted = sum(r[k] for r in matrix)
        precision = true_positive / predicted if predicted else None
        recall = true_positive / support if support else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision and recall
            else 0.0
            if precision is not None and recall is not None
            else None
        )
        rows.append(
            {"class": k, "precision": precision, "recall": recall, "f1": f1, "support": support}
        )
    return rows
