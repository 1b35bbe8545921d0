"""The confirmation's verdict: a candidate is named only where its fresh seeds show it faster than
the baseline beyond their noise, by the rank test of record/lead.py; otherwise the baseline."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from autotune.record import lead, verdict

MISS = None  # a run that did not reach the target


def runs(label: str, times: Sequence[float | None], *, first_seed: int = 0) -> list[dict]:
    return [
        {"label": label, "reached": t is not None, "time_to_target": t, "seed": first_seed + i}
        for i, t in enumerate(times)
    ]


def test_the_p_value_is_the_exact_share_of_splits_that_rank_as_far_ahead() -> None:
    assert lead.p_faster([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)  # 1 of C(6,3) splits
    assert lead.p_faster([4, 5, 6], [1, 2, 3]) == 1.0
    assert lead.p_faster([1, 2, 4], [3, 5, 6]) == pytest.approx(2 / 20)
    # misses rank last, tied with each other
    assert lead.p_faster([1, 2, 3], [math.inf] * 3) == pytest.approx(1 / 20)
    assert lead.p_faster([math.inf] * 3, [math.inf] * 3) == 1.0
    assert lead.p_faster([], [1.0]) == 1.0


def test_the_speedup_interval_holds_the_ratio_of_medians() -> None:
    low, high = lead.speedup_interval([1.0, 1.1, 0.9, 1.05], [2.0, 2.2, 1.8, 2.1])
    assert low <= 2.0 / 1.025 <= high and 1.5 < low and high < 2.5


def test_a_candidate_that_missed_on_its_fresh_seeds_never_wins() -> None:
    """The nanoGPT-shaped case: the trial reached the target in every search trial, and on 0 of
    2 fresh seeds; the baseline on 1 of 2."""
    decision = verdict.decide(runs("trial 2", [MISS, MISS]) + runs("baseline", [MISS, 3.1]))
    assert decision["winner"] == verdict.BASELINE and decision["outcome"] == verdict.MISSED
    # reaching on fewer seeds than the baseline loses, however fast those runs were
    decision = verdict.decide(runs("trial 2", [0.1, MISS, 0.1]) + runs("baseline", [3, 3, 3]))
    assert decision["winner"] == verdict.BASELINE and decision["outcome"] == verdict.MISSED


def test_a_lead_inside_the_noise_is_not_resolved_and_the_baseline_is_kept() -> None:
    """1.01x with overlapping runs: three runs each cannot tell."""
    decision = verdict.decide(
        runs("trial 4", [1.0, 1.3, 0.9]) + runs("baseline", [1.05, 0.95, 1.2])
    )
    assert decision["outcome"] == verdict.NOT_RESOLVED and decision["winner"] == verdict.BASELINE
    assert decision["leader"] == "trial 4" and decision["p_value"] > lead.ALPHA
    assert verdict.more_seeds_for(decision) == ["trial 4", verdict.BASELINE]


def test_a_lead_beyond_the_noise_wins_with_its_interval() -> None:
    decision = verdict.decide(runs("trial 4", [1.0, 1.1, 0.9]) + runs("baseline", [2.0, 2.3, 1.9]))
    assert decision["outcome"] == verdict.FASTER and decision["winner"] == "trial 4"
    assert decision["speedup"] == pytest.approx(2.0) and decision["p_value"] <= lead.ALPHA
    low, high = decision["interval"]
    assert low <= 2.0 <= high
    assert verdict.more_seeds_for(decision) == []


def test_the_level_is_shared_among_the_candidates_and_stricter_once_seeds_are_added() -> None:
    """Three candidates are three chances for a lucky one: 3 runs each cannot resolve any. With
    seeds added to the leader, each look at them is resolved at the stricter level."""
    three = (
        runs("trial 1", [1.0, 1.1, 0.9])
        + runs("trial 2", [1.5, 1.6, 1.4])
        + runs("trial 3", [1.7, 1.8, 1.6])
        + runs("baseline", [2.0, 2.3, 1.9])
    )
    decision = verdict.decide(three, seeds=3)
    assert decision["level"] == pytest.approx(lead.ALPHA / 3)
    assert decision["outcome"] == verdict.NOT_RESOLVED
    more = three + runs("trial 1", [1.0, 0.95], first_seed=3)
    more += runs("baseline", [2.1, 2.2], first_seed=3)
    decision = verdict.decide(more, seeds=3)
    assert decision["level"] == lead.ALPHA_ADDED and decision["leader"] == "trial 1"
    assert decision["outcome"] == verdict.FASTER  # 5 of 5 ahead: p = 1/252


def test_the_baseline_at_least_as_fast_by_median_ends_the_confirmation() -> None:
    decision = verdict.decide(runs("trial 1", [1.0, 1.5, 2.0]) + runs("baseline", [0.9, 1.4, 2.1]))
    assert decision["outcome"] == verdict.NOT_FASTER and verdict.more_seeds_for(decision) == []


def confirm(draw: Callable[[str], float], candidates: int, *, first: int = 3, cap: int = 8) -> dict:
    """One confirmation under confirm.runs: auto, its runs drawn by `draw(label)`: every candidate
    and the baseline on `first` seeds, then the leader and the baseline seed by seed while
    verdict.more_seeds_for asks, up to `cap` seeds."""
    labels = [f"trial {i}" for i in range(candidates)] + [verdict.BASELINE]
    records = [r for seed in range(first) for r in runs_at(labels, draw, seed)]
    for seed in range(first, cap + 1):
        decision = verdict.decide(records, seeds=first, interval=False)
        more = verdict.more_seeds_for(decision)
        if not more or seed == cap:
            return decision
        records += runs_at(more, draw, seed)
    raise AssertionError("unreachable")


def runs_at(labels: Sequence[str], draw: Callable[[str], float], seed: int) -> list[dict]:
    return [
        {"label": label, "reached": True, "time_to_target": draw(label), "seed": seed}
        for label in labels
    ]


# What the reference states: on configurations that are in truth the same, a winner is named in at
# most this share of confirmations.
FALSE_WINNERS = 0.07


@pytest.mark.parametrize("candidates", [1, 3])
def test_identical_configurations_are_named_faster_in_at_most_the_stated_share(
    candidates: int,
) -> None:
    """The whole rule, seeds added as confirm.runs: auto adds them, on candidates drawn from the
    baseline's own distribution (times that vary 30% from seed to seed)."""
    rng = random.Random(candidates)
    studies = 1500
    named = sum(
        confirm(lambda _: rng.lognormvariate(0, 0.3), candidates)["outcome"] == verdict.FASTER
        for _ in range(studies)
    )
    assert named / studies <= FALSE_WINNERS, f"{named} of {studies}"


def test_a_clearly_faster_configuration_is_found_and_a_slower_one_hardly_ever() -> None:
    """Twice as fast: named in nearly every confirmation; 20% slower: in well under the share that
    identical configurations are (three runs each that all happen to beat the baseline's)."""
    rng = random.Random(5)

    def draw(speed: float) -> Callable[[str], float]:
        return lambda label: rng.lognormvariate(0, 0.3) / (speed if label == "trial 0" else 1)

    fast = [confirm(draw(2.0), 1) for _ in range(300)]
    assert sum(d["winner"] == "trial 0" for d in fast) >= 0.85 * len(fast)
    slow = [confirm(draw(0.8), 1) for _ in range(300)]
    assert sum(d["winner"] == "trial 0" for d in slow) <= 0.01 * len(slow)


def test_seeds_the_baseline_skipped_count_as_runs_slower_than_every_one_of_the_leaders() -> None:
    """confirm.baseline: until_resolved stopped the baseline after 2 seeds, each run 4x the
    slowest of the leader's: with the third counted so, 3 runs each resolve the lead."""
    skipped = runs("trial 1", [1.0, 1.1, 1.2]) + runs("baseline", [5.0, 4.8])
    decision = verdict.decide(skipped, seeds=3)
    assert decision["outcome"] == verdict.FASTER and decision["winner"] == "trial 1"
    # seeds added later run the baseline too: what it skipped stays one seed
    added = skipped + runs("trial 1", [1.0], first_seed=3) + runs("baseline", [5.1], first_seed=3)
    assert verdict.decide(added, seeds=3)["p_value"] == pytest.approx(1 / 70)
