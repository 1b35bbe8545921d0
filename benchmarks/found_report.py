"""benchmarks/found.py's results: the file each study file's studies go in (its name, its record
with the summary and provenance) and the lines and table it prints."""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

from autotune.record import verdict
from autotune.spec.study_file import StudySpec
from benchmarks.arms import NONE_FOUND
from benchmarks.provenance import REPO, provenance

PLAIN_TPE = "plain_tpe"

# found-<study>-<strategy>[-r<replicates>][-load][-regret]-<device>.json: what results_name writes
RESULTS_NAME = re.compile(
    r"found-(?P<study>.+?)-(?P<strategy>[a-z_]+)(?:-r(?P<replicates>\d+))?(?P<load>-load)?"
    r"(?P<regret>-regret)?-(?P<device>[a-z]+)\.json"
)


def results_name(
    study: str, strategy: str, *, replicates: int | None, load: bool, regret: bool, device: str
) -> str:
    """The results file of one study file and strategy (replicates where not the objective's
    default)."""
    return (
        f"found-{study}-{strategy}"
        + (f"-r{replicates}" if replicates else "")
        + ("-load" if load else "")
        + ("-regret" if regret else "")
        + f"-{device}.json"
    )


def keeps_baseline(row: dict) -> bool:
    """Whether the study left the user with their baseline: it won the confirmation, or no
    configuration reached the target (nothing to switch to). The summary reads stored rows so
    too."""
    return row["winner"] in (verdict.BASELINE, NONE_FOUND)


def print_study(path: Path, seed: int, row: dict) -> None:
    """One study's line, as it finishes."""
    speed = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
    print(
        f"{path.stem} study seed {seed}: winner {row['winner']}, "
        f"baseline {row['baseline_median']} s, "
        f"winner {row['winner_median']} s, {speed}"
        + (
            f", regret {as_ratio(row['regret'])} (oracle {row['oracle_median']} s)"
            if "regret" in row
            else ""
        )
        + f", study took {row['tuning_wall']:.0f} s, compute {row['compute']:.0f} s",
        flush=True,
    )


def print_table(
    path: Path, spec: StudySpec, args: argparse.Namespace, results: list[dict], summary: dict
) -> None:
    """The studies of one file, each winner beside the baseline, and their summary."""
    print(
        f"\n{path.stem} ({PLAIN_TPE if args.plain_tpe else spec.objective}): "
        f"{len(results)} studies, winners re-measured on {args.seeds} "
        f"fresh seeds beside the baseline, by time to target"
    )
    print(
        f"{'seed':>4} {'winner':>10} {'baseline (s)':>13} {'winner (s)':>11} {'reached':>8} "
        f"{'speedup':>8} {'fixed':>7} {'tuning (s)':>11} {'compute (s)':>12}"
    )
    for r in results:
        reached = f"{r['stats']['winner']['reached']}/{r['stats']['winner']['runs']}"
        print(
            f"{r['seed']:>4} {r['winner']:>10} {as_seconds(r['baseline_median']):>13} "
            f"{as_seconds(r['winner_median']):>11} {reached:>8} {as_ratio(r['speedup']):>8} "
            f"{as_ratio(r.get('fixed_speedup')):>7} {r['tuning_wall']:>11.0f} "
            f"{r['trial_compute']:>12.0f}"
        )
    print(
        f"median speedup {as_ratio(summary['median_speedup'])} "
        f"(lowest {as_ratio(summary['min_speedup'])}), by the "
        f"fixed-schedule yardstick {as_ratio(summary['median_fixed_speedup'])}; "
        f"a winner other than the baseline beat the baseline's median "
        f"in {summary['beats_baseline']} of "
        f"{len(results)} studies; {summary['kept_baseline']} kept the baseline; median compute "
        f"{summary['median_compute']:.0f} s (trials {summary['median_trial_compute']:.0f} s)"
    )
    if args.oracle:
        print(
            f"regret (winner's median over the oracle's, side by side): "
            f"median {as_ratio(summary['median_regret'])}, "
            f"within 10% of the oracle in {summary['within_10']} of {len(results)}; "
            f"winner at or below the baseline's median in {summary['not_worse']} of "
            f"{len(results)}; predicted vs measured, median "
            f"|error| {summary['median_prediction_error']}"
        )


def summarize_rows(results: list[dict]) -> dict:
    """The benchmark's figures over its studies' rows."""
    # a winner that missed the target is no speedup
    speedups = [r["speedup"] or 0.0 for r in results]
    fixed = [r.get("fixed_speedup") or 0.0 for r in results if "fixed_stats" in r]
    summary = {
        "median_speedup": statistics.median(speedups) if speedups else None,
        "median_fixed_speedup": statistics.median(fixed) if fixed else None,
        "min_speedup": min(speedups) if speedups else None,
        "beats_baseline": sum(r["beats_baseline"] for r in results),
        "studies": len(results),
        "kept_baseline": sum(keeps_baseline(r) for r in results),
        "median_tuning_wall": statistics.median(r["tuning_wall"] for r in results),
        "median_trial_compute": statistics.median(r["trial_compute"] for r in results),
        "median_compute": statistics.median(r.get("compute", r["trial_compute"]) for r in results),
    }
    regrets = [r["regret"] for r in results if "regret" in r]
    if regrets:
        errors = [
            abs(r["prediction_error"]) for r in results if r.get("prediction_error") is not None
        ]
        summary.update(
            median_regret=statistics.median(math.inf if x is None else x for x in regrets),
            within_10=sum(x is not None and x <= 1.10 for x in regrets),
            not_worse=sum(r["not_worse"] or keeps_baseline(r) for r in results),
            median_prediction_error=statistics.median(errors) if errors else None,
        )
    phase_errors = [
        r["trial_prediction_error"] for r in results if r.get("trial_prediction_error") is not None
    ]
    if phase_errors:  # signed: above 0, the trials' own runs were slower than predicted
        summary["median_trial_prediction_error"] = statistics.median(phase_errors)
    return summary


def write(
    out: Path,
    path: Path,
    spec: StudySpec,
    device: object,
    args: argparse.Namespace,
    results: list[dict],
) -> dict:
    """Write the results so far with their summary and provenance; return the summary."""
    summary = summarize_rows(results)
    record = {
        "benchmark": "found",
        "study": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "args": {
            "seeds": args.seeds,
            "objective": spec.objective,
            "replicates": spec.replicates,
            "load": args.load,
            "plain_tpe": args.plain_tpe,
            "oracle": str(args.oracle) if args.oracle else None,
            "to_target": args.to_target,
        },
        **provenance(device),
        "summary": summary,
        "studies": results,
    }
    out.write_text(json.dumps(record, indent=1))
    return summary


def as_seconds(value: float | None) -> str:
    return "missed" if value is None else f"{value:.2f}"


def as_ratio(value: float | None) -> str:
    return "-" if value is None else "missed" if value == 0 else f"{value:.2f}x"
