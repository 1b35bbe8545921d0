"""Whether a candidate's lead over the baseline on fresh seeds is beyond the noise.

The rule: a one-sided rank test (Mann-Whitney's, exact, by permutation). Were the candidate and
the baseline the same configuration, every way of splitting their pooled runs into two groups of
the same sizes would be as likely; the p-value is the share of splits whose first group ranks at
least as far ahead as the candidate's runs do. The candidate is resolved faster when that share is
at most ALPHA: the rule then names a configuration no faster than the baseline in at most 5% of
studies. A run that missed the target counts as infinitely slow (it ranks last, tied with the other
misses). With 3 runs each, the candidate must beat every baseline run (p = 1/20); each run added
to both sides lets the rule tolerate more overlap.

The speedup is the baseline's median over the candidate's, with a bootstrap interval (each side's
runs resampled, CONFIDENCE of the resampled ratios within it).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

ALPHA = 0.05  # the p-value at which a lead on the confirmation's first seeds is resolved
ALPHA_ADDED = 0.01  # and once seeds were added to it (confirm.runs: auto), look by look
CONFIDENCE = 0.9  # of the speedup's interval
EXACT_SPLITS = 50_000  # beyond this many splits, the p-value is estimated from random ones
SAMPLED_SPLITS = 20_000
RESAMPLES = 2_000


def p_faster(candidate: Sequence[float], baseline: Sequence[float]) -> float:
    """The one-sided p-value that `candidate`'s times are shorter than `baseline`'s (math.inf: a
    run that missed); 1.0 where either side has no run."""
    if not candidate or not baseline:
        return 1.0
    ranks = _mid_ranks([*candidate, *baseline])
    size = len(candidate)
    observed = sum(ranks[:size])
    slack = 1e-9 * len(ranks)  # mid-ranks are halves: sums compared with room for rounding
    splits = math.comb(len(ranks), size)
    if splits <= EXACT_SPLITS:
        at_least = sum(
            sum(group) <= observed + slack for group in itertools.combinations(ranks, size)
        )
        return at_least / splits
    draw = random.Random(0)  # a fixed stream: the same runs give the same verdict
    at_least = sum(sum(draw.sample(ranks, size)) <= observed + slack for _ in range(SAMPLED_SPLITS))
    return (at_least + 1) / (SAMPLED_SPLITS + 1)


def speedup_interval(
    candidate: Sequence[float], baseline: Sequence[float]
) -> tuple[float, float] | None:
    """The CONFIDENCE bootstrap interval of the baseline's median over the candidate's; None where
    either side has no run. A median that is a miss makes its ratio infinite (or zero)."""
    if not candidate or not baseline:
        return None
    draw = random.Random(0)
    ratios = sorted(
        _ratio(
            statistics.median(draw.choices(baseline, k=len(baseline))),
            statistics.median(draw.choices(candidate, k=len(candidate))),
        )
        for _ in range(RESAMPLES)
    )
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * (RESAMPLES - 1))], ratios[math.ceil((1 - tail) * (RESAMPLES - 1))]


def _ratio(base: float, mine: float) -> float:
    if math.isinf(mine):
        return 0.0 if not math.isinf(base) else 1.0
    return base / mine


def _mid_ranks(values: Sequence[float]) -> list[float]:
    """Each value's rank from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            ranks[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return ranks
