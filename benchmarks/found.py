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
per study file (-r<replicates> where they are not the objective's default; --results: another
folder). Compute counts every training second a study spent: its trials and the systems probe.
One study is run and re-measured in found_study.py; the results file and
the table are found_report.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna

from autotune.spec.study_file import OBJECTIVES, REPLICATES_DEFAULT
from autotune.study import preparation
from benchmarks.found_report import (
    PLAIN_TPE,
    print_study,
    print_table,
    results_name,
    write,
)
from benchmarks.found_study import load, one_study
from benchmarks.provenance import REPO, RESULTS, provenance


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
    parser.add_argument(
        "--results", type=Path, default=RESULTS, metavar="DIR", help="where to write them"
    )
    return parser.parse_args()


def run_file(path: Path, args: argparse.Namespace) -> None:
    """The studies of one study file not yet in its results file, then its table."""
    spec = load(path, objective=args.objective, replicates=args.replicates)
    device = preparation.resolve_device(spec)
    replicated = spec.replicates != REPLICATES_DEFAULT[spec.objective] and not args.plain_tpe
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / results_name(
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
            print_study(path, seed, row)
            write(out, path, spec, device, args, sorted(rows.values(), key=lambda r: r["seed"]))
    results = sorted(rows.values(), key=lambda r: r["seed"])
    summary = write(out, path, spec, device, args, results)
    print_table(path, spec, args, results, summary)
    print(f"written: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
