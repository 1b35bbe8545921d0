"""autotune.search.batches: the largest micro-batch of a space with steps enough an epoch, where
the probe measures and the prior's first trials start."""

from __future__ import annotations

from autotune.search import batches
from autotune.search.space import Choices, Space

BASELINE = {"batch_size": 32}


def test_the_probe_measures_at_the_largest_batch_that_gives_enough_steps() -> None:
    """A GPU at the baseline's 32 samples waits on launches, not on data: the settings are judged
    at the largest micro-batch with MIN_STEPS steps an epoch, never below the baseline's."""
    wide = Space(domains=(("batch_size", Choices((16, 32, 128, 512))),))
    assert batches.largest_batch(wide, BASELINE, samples=128 * batches.MIN_STEPS) == 128
    assert batches.largest_batch(wide, BASELINE, samples=None) == 32  # unknown: the baseline's
    assert batches.largest_batch(wide, BASELINE, samples=10 * batches.MIN_STEPS) == 32
