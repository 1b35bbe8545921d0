"""Search efficiency: replay searches against the measured grid (benchmarks/grid.py).

Every strategy searches the grid's discretized space with the same trial budget; a trial's
outcome is looked up in the grid instead of trained (one of its configuration's measured runs,
drawn at random, as a real trial is one noisy run), so each strategy can be run on many seeds in
seconds, and all of them see the same measurements. A configuration's true time is its median
over its runs. Per strategy and seed:

- tuning compute: the training seconds the trials spent, a pruned trial counted up to where it
  stopped (the incumbent's time, or the learning-curve point at which a pruner stopped it);
- trials and compute until the configuration the search would report (its fastest single run)
  is, by its true time, within 10% (and 25%) of the grid's optimum (the best true time); a
  search that never gets there counts as infinite.

Strategies: random search; Optuna's default TPE (no domain knowledge); autotune's sampler alone;
autotune's sampler with incumbent pruning (the trial stops once its clock passes the best time to
target so far); the latter after autotune's systems probe (run for real here, its seconds
charged to the search); and with Optuna's median and successive-halving pruners on the learning
curve.

Then whole studies at the shipped budget (`--studies` of `--study-trials` trials per variant), to
the winner each reports: plain TPE (one run a trial, the fastest trial wins), autotune with one
run a trial, as shipped in studies/digits.yaml (a first run that beats the best so far runs 3
seeds, their mean its time), without the confirmation, and with the baseline as the first
trial. The confirmation re-runs the best 3 trials and the baseline 3 times each (runs drawn
from the grid like the trials') and the lowest median wins. Per variant: the winner's regret
(its true time over the optimum's), whether it is at or below the baseline's true time, and the
compute, confirmation included. Usage (from the repository root):

    .venv/bin/python benchmarks/search.py [--seeds 20] [--trials 40] [--studies 200]
                                          [--study-trials 20]

Prints a table and writes benchmarks/results/search-<the grid's name>.json (search-digits-cpu.json
for grid-digits-cpu.jsonl; --results: another folder). The replays are in search_replay.py, their
tables in search_tables.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna

from benchmarks.grid import GRID, load_grid, true_time
from benchmarks.provenance import REPO, RESULTS
from benchmarks.search_replay import outcome
from benchmarks.search_tables import WITHIN, searches, whole_studies


def measure_probe() -> tuple[dict[str, Any], dict[str, Any]]:
    """autotune's systems probe, run for real on the digits task over the grid's loader settings
    and precisions: what it settles and what it costs (the replay charges its seconds); and the
    task's baseline configuration."""
    from autotune.probe import run
    from autotune.spec import study_file
    from autotune.spec.checks import read_yaml
    from autotune.study import preparation

    raw = read_yaml(REPO / "studies" / "digits.yaml")
    raw["space"] = {**{k: v for k, v in GRID.items()}, "prefetch_factor": 2, "pin_memory": False}
    with tempfile.TemporaryDirectory() as folder:  # a storage the study file accepts; unopened
        spec = study_file.from_mapping(
            raw, path=REPO / "studies" / "digits.yaml", storage=f"sqlite:///{folder}/probe.db"
        )
        prepared = preparation.prepare(spec)
        try:
            outcome = run.run(spec, prepared)
        finally:
            if prepared.end_measuring is not None:
                prepared.end_measuring()
        return outcome, {name: prepared.baseline[name] for name in GRID}


def main() -> None:
    args = arguments()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    header, grid = load_grid(args.grid)
    truth, optimum, grid_compute = judge_grid(args.grid, grid)
    probed, baseline = measure_probe()
    from autotune.probe.model.outcome import describe

    print(describe(probed))
    runs, summary = searches(args, grid, probed, optimum)
    study_summary = whole_studies(args, grid, probed, baseline, truth, optimum)
    record = {
        "benchmark": "search",
        "args": {k: str(v) for k, v in vars(args).items() if k != "results"},
        "grid": header,
        "optimum": optimum,
        "grid_compute": grid_compute,
        "probe": probed,
        "within": list(WITHIN),
        "summary": {
            n: {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in s.items()}
            for n, s in summary.items()
        },
        "runs": runs,
        "baseline": baseline,
        "studies": study_summary,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / args.grid.name.replace("grid-", "search-").replace(".jsonl", ".json")
    out.write_text(json.dumps(record, indent=1))
    print(f"written: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


def judge_grid(
    path: Path, grid: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, float], float, float]:
    """Each configuration's true time, the optimum and the grid's training seconds; printed. Exits
    where the grid is unfinished: a search could ask for a configuration it lacks."""
    configs = 1
    for values in GRID.values():
        configs *= len(values)
    if len(grid) < configs:
        sys.exit(
            f"{path} holds {len(grid)} of the grid's {configs} configurations: "
            "run benchmarks/grid.py to finish it"
        )
    seeds = sorted({row.get("seed") for runs in grid.values() for row in runs}, key=str)
    truth = {k: true_time(runs) for k, runs in grid.items()}
    reached = [t for t in truth.values() if math.isfinite(t)]
    optimum = min(reached)
    grid_compute = sum(outcome(row) for runs in grid.values() for row in runs)
    print(
        f"grid: {len(grid)} configurations x {len(seeds)} seed(s); "
        f"{len(reached)} reach the target by their median; "
        f"optimum {optimum:.2f} s (median); "
        f"measuring all of it took {grid_compute:.0f} s of training"
    )
    best = min(truth, key=truth.get)
    times = sorted(r["time_to_target"] for r in grid[best] if r["reached"])
    print(
        f"the optimum: {best}, runs {', '.join(f'{t:.2f}' for t in times)} s; "
        f"{sum(t <= optimum * 1.1 for t in truth.values())} configurations within 10% of it"
    )
    return truth, optimum, grid_compute


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, default=RESULTS / "grid-digits-cpu.jsonl")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument(
        "--studies", type=int, default=200, help="whole studies replayed per variant"
    )
    parser.add_argument(
        "--study-trials", type=int, default=20, help="their budget (the shipped study's)"
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, metavar="DIR", help="where to write it"
    )
    return parser.parse_args()


if __name__ == "__main__":
    main()
