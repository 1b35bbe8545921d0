"""The micro-batch a run of a space is busiest at with steps enough: the largest of the space that
still leaves `MIN_STEPS` optimizer steps an epoch. The systems probe measures there
(probe/run.py), and the prior's first trials start there (prior.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.search.space import Space, every_value

# optimizer steps an epoch at that micro-batch: fewer, and start-up dominates a run
MIN_STEPS = 20


def largest_batch(space: Space, baseline: Mapping[str, Any], *, samples: int | None) -> int:
    """The largest micro-batch of the space with `MIN_STEPS` steps in a run of `samples` samples,
    and never below the baseline's (the baseline's where `samples` is unknown)."""
    fitting = [
        b
        for b in every_value(space["batch_size"])
        if samples is not None and samples / b >= MIN_STEPS
    ]
    return max([baseline["batch_size"], *fitting])
