"""benchmarks/search.py's two tables: each strategy's searches, and each variant's whole studies,
replayed over many seeds (benchmarks/search_replay.py) and summarized by their medians."""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Any

from benchmarks.grid import key
from benchmarks.search_replay import STRATEGIES, STUDIES, replay, replay_study

# "near the optimum": a time to target at most this much above the grid's best
WITHIN = (
    0.10,
    0.25,
)


def median_or_inf(values: list[float | None]) -> float:
    return statistics.median(math.inf if v is None else v for v in values)


def first_within(
    improvements: list[tuple[int, float, float]], limit: float
) -> tuple[int, float] | None:
    """(trials, compute) when the configuration the search would report first came within `limit`
    seconds (by its true time); None if never."""
    return next(((n, c) for n, c, best in improvements if best <= limit), None)


def searches(
    args: argparse.Namespace, grid: dict[str, Any], probed: dict[str, Any], optimum: float
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """Each strategy's `--seeds` searches of `--trials` trials, replayed, and their medians: how
    soon each got within WITHIN of the optimum, in trials and compute; printed as a table."""
    runs = {
        name: [
            replay(grid, strategy=strategy, seed=seed, trials=args.trials, probed=probed)
            for seed in range(args.seeds)
        ]
        for name, strategy in STRATEGIES.items()
    }
    summary = {}
    for name, found in runs.items():
        summary[name] = {
            "compute": statistics.median(s["compute"] for s in found),
            "best": median_or_inf([s["best"] for s in found]),
        }
        for within in WITHIN:
            near = [first_within(s["improvements"], optimum * (1 + within)) for s in found]
            summary[name][f"trials_{within:.0%}"] = median_or_inf(
                [n[0] if n else None for n in near]
            )
            summary[name][f"compute_{within:.0%}"] = median_or_inf(
                [n[1] if n else None for n in near]
            )
            summary[name][f"reached_{within:.0%}"] = sum(n is not None for n in near)
    print(
        f"{args.seeds} searches of {args.trials} trials per strategy; medians over searches "
        "(inf: the median search did not get within that much of the optimum "
        f"in {args.trials} trials)"
    )
    head = "".join(
        f" {'trials to ' + format(w, '.0%'):>14} {'compute to ' + format(w, '.0%'):>15} "
        f"{'got there':>9}"
        for w in WITHIN
    )
    print(f"{'strategy':<27} {'compute (s)':>11} {'best (s)':>9}{head}")
    for name, s in summary.items():
        cells = "".join(
            f" {s[f'trials_{w:.0%}']:>14} {s[f'compute_{w:.0%}']:>15.0f} "
            f"{s[f'reached_{w:.0%}']:>6}/{args.seeds}"
            for w in WITHIN
        )
        print(f"{name:<27} {s['compute']:>11.0f} {s['best']:>9.2f}{cells}")
    return runs, summary


def whole_studies(
    args: argparse.Namespace,
    grid: dict[str, Any],
    probed: dict[str, Any],
    baseline: dict[str, Any],
    truth: dict[str, float],
    optimum: float,
) -> dict[str, dict[str, Any]]:
    """Each variant's `--studies` whole studies, replayed to the winner each reports: its regret
    over the optimum, and how often it was not worse than the baseline; printed as a table."""
    studies = {
        name: [
            replay_study(
                grid,
                strategy=strategy,
                seed=seed,
                trials=args.study_trials,
                baseline=baseline,
                probed=probed,
            )
            for seed in range(args.studies)
        ]
        for name, strategy in STUDIES.items()
    }
    base = truth[key(baseline)]
    print(
        f"\n{args.studies} whole studies of {args.study_trials} trials per variant, "
        "to the winner each reports; "
        f"regret: the winner's median over the optimum's (the baseline's {base / optimum:.2f}x)"
    )
    print(
        f"{'variant':<36} {'regret':>7} {'within 10%':>10} {'not worse':>9} "
        f"{'kept baseline':>13} {'compute (s)':>11}"
    )
    study_summary = {}
    for name, found in studies.items():
        regrets = [truth[s["winner"]] / optimum for s in found]
        study_summary[name] = {
            "median_regret": statistics.median(regrets),
            "within_10": sum(r <= 1.1 for r in regrets),
            "not_worse": sum(truth[s["winner"]] <= base for s in found),
            "kept_baseline": sum(s["kept_baseline"] for s in found),
            "median_compute": statistics.median(s["compute"] for s in found),
        }
        row = study_summary[name]
        print(
            f"{name:<36} {row['median_regret']:>6.2f}x {row['within_10']:>6}/{args.studies} "
            f"{row['not_worse']:>5}/{args.studies} {row['kept_baseline']:>9}/{args.studies} "
            f"{row['median_compute']:>11.0f}"
        )
    return study_summary
