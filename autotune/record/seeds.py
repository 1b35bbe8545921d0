"""The seed scheme: every seed a study uses, from its one `seed:`, and none used twice.

A study's runs take their seeds from blocks of 100,000 per study seed:

    study seed * 100,000 + n            trial n's first run (n < 50,000); paired trials all use + 0
    study seed * 100,000 + 50,000 + i   the confirmation's i-th fresh seed
    study seed * 100,000 + 90,000       the systems probe's runs
    study seed * 100,000 + 95,000       kept apart: an earlier engine's throughput measurements
    a run's seed + k * REPLICATE_STRIDE  the k-th extra run (replicate) of a trial

REPLICATE_STRIDE lies far past every block, so a replicate never meets another run's seed. The
sampler's own seed is the study seed moved past the trials already stored (a resumed study must
not replay its first random configurations) and apart for each worker.
"""

from __future__ import annotations

BLOCK = 100_000  # seeds per study seed
FRESH = 50_000  # the confirmation's fresh seeds start here in a block; trials stay below
PROBE = 90_000
REPLICATE_STRIDE = 10**12
WORKER_STRIDE = 1000  # sampler seeds apart for each worker of one study


def for_trial(study_seed: int, number: int, *, paired: bool = False) -> int:
    """Trial `number`'s own seed (its first run's), or, `paired`, the one every trial shares."""
    return study_seed * BLOCK + (0 if paired else number)


def replicates(first: int, runs: int) -> list[int]:
    """The seeds of a trial's `runs` runs; the first is the trial's own."""
    return [first + k * REPLICATE_STRIDE for k in range(runs)]


def fresh(study_seed: int, runs: int) -> list[int]:
    """The confirmation's seeds: no study trial uses them."""
    return [study_seed * BLOCK + FRESH + i for i in range(runs)]


def for_probe(study_seed: int) -> int:
    """The systems probe's seed: no trial or confirmation run uses it."""
    return study_seed * BLOCK + PROBE


def for_sampler(study_seed: int, *, stored_trials: int, worker: int | None) -> int:
    """The sampler's seed for a run that finds `stored_trials` trials already stored (numpy's
    seeds are 32-bit)."""
    return (study_seed + stored_trials + WORKER_STRIDE * (worker or 0)) % 2**32
