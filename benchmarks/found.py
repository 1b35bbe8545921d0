"""Found vs baseline: how much faster is the configuration autotune reports than the study's
baseline?

For each study file and each of `--studies` study seeds, runs the whole study as `autotune run`
would (probe, trials, confirmation; a fresh storage each time) and takes the winner it reports. Then
re-measures the winner and the baseline side by side on `--seeds` fresh seeds, interleaved (seeds no
study uses), and records both medians. A study whose winner is the baseline itself recommended
keeping what the user had: its re-measured "speedup" shows only the noise between two sets of runs
of one configuration, and it does not count as beating the baseline. Usage (from the repository
root):

    .venv/bin/python benchmarks/found.py [--studies 10] [--seeds 5] [--objective fixed_schedule]
                                         [--replicates 3] [--plain-tpe] [--load] [--oracle GRID]
                                         [--to-target] [studies/digits.yaml ...]

`--load` runs each study while the benchmark keeps one process spinning on a core (started before
the study, stopped before the re-measurement, which stays on a quiet machine): a shared machine.

Studies already in the results file are kept and not run again (--fresh discards them), so an
interrupted run goes on where it stopped and `--first 6 --studies 5` adds studies 6-10.

`--plain-tpe` runs, instead of autotune, what a user would write without it: a loop over Optuna's
default TPE sampler with the study's knobs (as the device allows them), the study's trial budget,
each trial one training run to the target or the limits, no probe, pruning, replicates or
confirmation; its winner is the trial with the lowest time to target.

`--oracle GRID` adds a third candidate to the re-measurement: the fastest configuration of a
ground-truth grid (benchmarks/grid.py), the lowest median time to target over its seeds; under
`systems_only`, the fastest with the baseline's maths. Where the study searches knobs the grid
leaves out (channels_last), the oracle is re-measured under each of their values and the fastest
counts. The winner's regret is its median over the oracle's, measured side by side. `--to-target`
stops the re-measurement's runs at the target (time to target only, no fixed-schedule yardstick):
cheaper.

`--objective` runs the studies under that objective instead of the study file's. Whatever the
objective, the winner and the baseline are re-measured the same way: each run trains its whole
schedule (schedule_epochs long) and notes when it first reached the target, which gives both
yardsticks: time to target (the speedup column) and whole-schedule time where the mean final
metric reaches the target (the "fixed" column).

Prints a table and writes benchmarks/results/
found-<study>-<objective or plain_tpe>[-r<replicates>][-load][-regret]-<device>.json
per study file (-r<replicates> where they are not the objective's default). Compute counts every
training second a study spent: its trials, the systems probe and the throughput phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from autotune.record import verdict
from autotune.search.space import FORMAT_KNOBS, LOADER_KNOBS, Choices, Space
from autotune.spec.checks import read_yaml  # noqa: E402
from autotune.spec.study_file import (
    FIXED_SCHEDULE,
    OBJECTIVES,
    REPLICATES_DEFAULT,
    SYSTEMS_ONLY,
    StudySpec,
    from_mapping,
)
from autotune.study import confirm, preparation
from benchmarks.arms import NONE_FOUND, autotune_study, plain_tpe_study  # noqa: E402
from benchmarks.provenance import REPO, RESULTS, provenance  # noqa: E402
from benchmarks.search import load_grid, true_time  # noqa: E402

REMEASURE_SEED = 7_000_000  # far from every seed a study uses (study seed * 100,000 + ...)
PLAIN_TPE = "plain_tpe"
ORACLE = "oracle"
# What systems_only may change; everything else in a grid configuration is the maths it keeps
# (digits has BatchNorm, so its micro-batch is maths too).
SYSTEMS = (*LOADER_KNOBS, *FORMAT_KNOBS)


def load(
    path: Path, *, objective: str | None, replicates: int | None = None, storage: str | None = None
) -> StudySpec:
    """The study file, under `objective` and with `replicates` where they are given."""
    raw = read_yaml(path)
    raw = {
        **raw,
        **{
            k: v for k, v in (("objective", objective), ("replicates", replicates)) if v is not None
        },
    }
    return from_mapping(raw, path=path, storage=storage)


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


def oracle(grid: Path, baseline: dict, *, same_maths: bool) -> tuple[dict, float]:
    """The grid's fastest configuration by median time to target, and that median (with
    `same_maths`, the fastest of those with the baseline's maths)."""
    _, runs = load_grid(grid)
    if same_maths:
        runs = {
            k: r
            for k, r in runs.items()
            if all(v == baseline[name] for name, v in r[0]["config"].items() if name not in SYSTEMS)
        }
    best = min(runs, key=lambda k: true_time(runs[k]))
    return dict(runs[best][0]["config"]), true_time(runs[best])


def oracle_variants(config: dict, space: Space) -> dict[str, dict]:
    """The grid's oracle under every value of the knobs the study searches and the grid leaves out
    (channels_last, on digits): a winner may use them, so the oracle may too. Labelled by them."""
    left_out = [
        (name, d.values)
        for name, d in space.domains
        if name not in config and isinstance(d, Choices) and len(d.values) > 1
    ]
    names = [name for name, _ in left_out]
    return {
        ORACLE + "".join(f" {k}={v}" for k, v in zip(names, values)): {
            **config,
            **dict(zip(names, values)),
        }
        for values in itertools.product(*(v for _, v in left_out))
    }


def one_study(
    path: Path,
    *,
    seed: int,
    seeds: int,
    folder: Path,
    objective: str | None = None,
    replicates: int | None = None,
    load_machine: bool = False,
    plain_tpe: bool = False,
    grid: Path | None = None,
    to_target: bool = False,
) -> dict:
    """Run the study with `seed` (beside a busy process with `load_machine`); re-measure its
    winner against the baseline (and the grid's oracle) on fresh seeds, on a quiet machine."""
    spec = load(
        path,
        objective=objective,
        replicates=replicates,
        storage=f"sqlite:///{folder / f'{path.stem}-{seed}.db'}",
    )
    spec = dataclasses.replace(spec, seed=seed, name=f"{spec.name}-{seed}")
    prepared = preparation.prepare(spec)
    found = (plain_tpe_study if plain_tpe else autotune_study)(spec, prepared, load_machine)
    candidates = {verdict.BASELINE: prepared.baseline, "winner": dict(found["params"])}
    if grid is not None:
        fastest, grid_median = oracle(
            grid, prepared.baseline, same_maths=spec.objective == SYSTEMS_ONLY
        )
        variants = oracle_variants(fastest, prepared.space)
        candidates.update(variants)
    # Every run trains its whole schedule and notes when it first reached the target: the same
    # runs give both objectives' yardsticks, whatever the study's objective was (--to-target: the
    # first only).
    whole = dataclasses.replace(preparation.limits_for(spec), stop_at_target=to_target)
    runs = confirm.run_candidates(
        prepared.run_trial,
        candidates,
        device=prepared.device,
        limits=whole,
        seeds=[REMEASURE_SEED + 1000 * seed + i for i in range(seeds)],
    )
    stats = verdict.stats(runs)
    base, won = stats[verdict.BASELINE]["median"], stats["winner"]["median"]
    kept_baseline = keeps_baseline(found)  # re-measuring it against itself shows only the noise
    row = {
        "seed": seed,
        **found,
        "baseline_median": base,
        "winner_median": won,
        "speedup": base / won if base and won else None,
        "beats_baseline": bool(
            not kept_baseline and won is not None and (base is None or won < base)
        ),
        # never worse: the winner's median at or below the baseline's (keeping the baseline counts)
        "not_worse": bool(kept_baseline or (won is not None and (base is None or won <= base))),
        "loaded": load_machine,
        "stats": stats,
        "runs": runs,
    }
    if grid is not None:
        medians = {label: stats[label]["median"] for label in variants}
        label = min(medians, key=lambda v: math.inf if medians[v] is None else medians[v])
        best = medians[label]
        row.update(
            oracle=candidates[label],
            oracle_median=best,
            oracle_grid_median=grid_median,
            oracle_variants=medians,
            regret=won / best if won and best else None if best is None else math.inf,
        )
    if not to_target:
        # the fixed-schedule yardstick: whole-schedule time, counted only where the mean final
        # metric reaches the target
        fixed = verdict.stats(runs, objective=FIXED_SCHEDULE, target=spec.target.value)
        fixed_base, fixed_won = fixed[verdict.BASELINE]["median"], fixed["winner"]["median"]
        row.update(
            fixed_stats=fixed,
            fixed_speedup=fixed_base / fixed_won if fixed_base and fixed_won else None,
        )
    return row


def main() -> None:
    args = arguments()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for path in args.studies_files:
        run_file(path, args)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "studies_files", nargs="*", type=Path, default=[REPO / "studies" / "digits.yaml"]
    )
    parser.add_argument(
        "--studies", type=int, default=10, help="independent studies (study seeds 1..N) per file"
    )
    parser.add_argument(
        "--seeds", type=int, default=5, help="fresh seeds for the side-by-side re-measurement"
    )
    parser.add_argument(
        "--objective", choices=OBJECTIVES, help="run the studies under this objective"
    )
    parser.add_argument("--replicates", type=int, help="run the studies with this many replicates")
    parser.add_argument("--first", type=int, default=1, help="the first study seed")
    parser.add_argument(
        "--fresh", action="store_true", help="discard the studies already in the results file"
    )
    parser.add_argument(
        "--load", action="store_true", help="run each study beside a process spinning on one core"
    )
    parser.add_argument(
        "--plain-tpe",
        action="store_true",
        help="a hand-written loop over Optuna's TPE instead of autotune",
    )
    parser.add_argument(
        "--oracle",
        type=Path,
        metavar="GRID",
        help="re-measure the grid's fastest configuration too",
    )
    parser.add_argument(
        "--to-target", action="store_true", help="re-measurement runs stop at the target"
    )
    return parser.parse_args()


def run_file(path: Path, args: argparse.Namespace) -> None:
    """The studies of one study file not yet in its results file, then its table."""
    spec = load(path, objective=args.objective, replicates=args.replicates)
    device = preparation.resolve_device(spec)
    replicated = spec.replicates != REPLICATES_DEFAULT[spec.objective] and not args.plain_tpe
    out = RESULTS / results_name(
        path.stem,
        PLAIN_TPE if args.plain_tpe else spec.objective,
        replicates=spec.replicates if replicated else None,
        load=args.load,
        regret=args.oracle is not None,
        device=device.type,
    )
    # Resumable: the studies already in the file (same fresh-seed count) are kept, each with
    # the commit that produced it; --fresh starts over.
    kept = json.loads(out.read_text()).get("studies", []) if out.exists() and not args.fresh else []
    rows = {
        r["seed"]: r
        for r in kept
        if r.get("fresh_seeds", args.seeds) == args.seeds
        and (not args.oracle or "oracle_variants" in r)
    }
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first, args.first + args.studies):
            if seed in rows:
                continue
            row = one_study(
                path,
                seed=seed,
                seeds=args.seeds,
                folder=Path(tmp),
                objective=args.objective,
                replicates=args.replicates,
                load_machine=args.load,
                plain_tpe=args.plain_tpe,
                grid=args.oracle,
                to_target=args.to_target,
            )
            rows[seed] = {
                **row,
                "fresh_seeds": args.seeds,
                "commit": provenance(device)["commit"],
            }
            speed = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
            print(
                f"{path.stem} study seed {seed}: winner {row['winner']}, "
                f"baseline {row['baseline_median']} s, "
                f"winner {row['winner_median']} s, {speed}"
                + (
                    f", regret {_x(row['regret'])} (oracle {row['oracle_median']} s)"
                    if "regret" in row
                    else ""
                )
                + f", study took {row['tuning_wall']:.0f} s, compute {row['compute']:.0f} s",
                flush=True,
            )
            write(out, path, spec, device, args, sorted(rows.values(), key=lambda r: r["seed"]))
    results = sorted(rows.values(), key=lambda r: r["seed"])
    summary = write(out, path, spec, device, args, results)
    print_table(path, spec, args, results, summary)
    print(f"written: {out.relative_to(REPO)}")


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
            f"{r['seed']:>4} {r['winner']:>10} {_s(r['baseline_median']):>13} "
            f"{_s(r['winner_median']):>11} {reached:>8} {_x(r['speedup']):>8} "
            f"{_x(r.get('fixed_speedup')):>7} {r['tuning_wall']:>11.0f} "
            f"{r['trial_compute']:>12.0f}"
        )
    print(
        f"median speedup {_x(summary['median_speedup'])} "
        f"(lowest {_x(summary['min_speedup'])}), by the "
        f"fixed-schedule yardstick {_x(summary['median_fixed_speedup'])}; "
        f"a winner other than the baseline beat the baseline's median "
        f"in {summary['beats_baseline']} of "
        f"{len(results)} studies; {summary['kept_baseline']} kept the baseline; median compute "
        f"{summary['median_compute']:.0f} s (trials {summary['median_trial_compute']:.0f} s)"
    )
    if args.oracle:
        print(
            f"regret (winner's median over the oracle's, side by side): "
            f"median {_x(summary['median_regret'])}, "
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


def _s(value: float | None) -> str:
    return "missed" if value is None else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else "missed" if value == 0 else f"{value:.2f}x"


if __name__ == "__main__":
    main()
