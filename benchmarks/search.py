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
for grid-digits-cpu.jsonl).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from autotune.study.sampler import tpe_sampler  # noqa: E402
from benchmarks.grid import GRID, key  # noqa: E402
from benchmarks.provenance import REPO, RESULTS  # noqa: E402

# "near the optimum": a time to target at most this much above the grid's best
WITHIN = (
    0.10,
    0.25,
)


def load_grid(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The grid's header, and every configuration's runs (one per seed it was measured with)."""
    lines = path.read_text().splitlines()
    grid: dict[str, list[dict[str, Any]]] = {}
    for row in map(json.loads, lines[1:]):
        grid.setdefault(key(row["config"]), []).append(row)
    return json.loads(lines[0]), grid


def true_time(runs: list[dict[str, Any]]) -> float:
    """A configuration's time to target as the benchmark judges it: the median over its runs, a
    run that missed the target counting as infinitely slow (so a lucky run alone is not enough)."""
    return statistics.median(r["time_to_target"] if r["reached"] else math.inf for r in runs)


def outcome(row: dict[str, Any]) -> float:
    """What the study minimizes: time to target, or the time spent when the target was missed."""
    return row["time_to_target"] if row["reached"] else row["train_seconds"]


Pruner = Callable[[], optuna.pruners.BasePruner]
STRATEGIES: dict[str, dict[str, Any]] = {
    "random": {"sampler": lambda seed, trials: optuna.samplers.RandomSampler(seed=seed)},
    "tpe-default": {"sampler": lambda seed, trials: optuna.samplers.TPESampler(seed=seed)},
    "autotune-sampler": {"sampler": lambda seed, trials: tpe_sampler(seed=seed, trials=trials)},
    "autotune+incumbent": {
        "sampler": lambda seed, trials: tpe_sampler(seed=seed, trials=trials),
        "incumbent": True,
    },
    "autotune+incumbent+probe": {
        "sampler": lambda seed, trials: tpe_sampler(seed=seed, trials=trials),
        "incumbent": True,
        "probe": True,
    },
    "autotune+incumbent+median": {
        "sampler": lambda seed, trials: tpe_sampler(seed=seed, trials=trials),
        "incumbent": True,
        "pruner": lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2),
    },
    "autotune+incumbent+sha": {
        "sampler": lambda seed, trials: tpe_sampler(seed=seed, trials=trials),
        "incumbent": True,
        "pruner": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=2),
    },
}


def measure_probe() -> tuple[dict[str, Any], dict[str, Any]]:
    """autotune's systems probe, run for real on the digits task over the grid's loader settings
    and precisions: what it settles and what it costs (the replay charges its seconds); and the
    task's baseline configuration."""
    from autotune.spec import study_file
    from autotune.spec.checks import read_yaml
    from autotune.study import preparation
    from autotune.study.begin import run_probe

    raw = read_yaml(REPO / "studies" / "digits.yaml")
    raw["space"] = {**{k: v for k, v in GRID.items()}, "prefetch_factor": 2, "pin_memory": False}
    with tempfile.TemporaryDirectory() as folder:  # a storage the study file accepts; unopened
        spec = study_file.from_mapping(
            raw, path=REPO / "studies" / "digits.yaml", storage=f"sqlite:///{folder}/probe.db"
        )
        prepared = preparation.prepare(spec)
        return run_probe(spec, prepared), {name: prepared.baseline[name] for name in GRID}


def searched_space(
    strategy: dict[str, Any], probed: dict[str, Any] | None
) -> tuple[float, dict[str, list]]:
    """The compute a search starts with and the grid space it searches: after a probe (with a
    strategy that probes), its seconds spent and the loader setting and precisions it settled."""
    space = dict(GRID)
    if not strategy.get("probe"):
        return 0.0, space
    space["num_workers"] = [probed["loader"]["num_workers"]]
    space["precision"] = [p for p in GRID["precision"] if p in probed["precisions"]]
    return probed["seconds"], space


def replay(
    grid: dict[str, list[dict[str, Any]]],
    *,
    strategy: dict[str, Any],
    seed: int,
    trials: int,
    probed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One search of `trials` trials: its compute, and each change of the configuration it would
    report as (trials so far, compute so far, that configuration's true time). A trial sees one
    of its configuration's measured runs, drawn at random, as a study sees one noisy run. With
    `probed` (and a strategy that probes), the search starts after the probe's seconds, over the
    loader setting and precisions it settled."""
    draw = random.Random(seed)
    pruner = strategy.get("pruner", lambda: optuna.pruners.NopPruner())()
    study = optuna.create_study(
        direction="minimize", sampler=strategy["sampler"](seed, trials), pruner=pruner
    )
    incumbent = math.inf
    compute, space = searched_space(strategy, probed)
    improvements: list[tuple[int, float, float]] = []
    for number in range(trials):
        trial = study.ask()
        config = {name: trial.suggest_categorical(name, values) for name, values in space.items()}
        runs = grid[key(config)]
        row = draw.choice(runs)
        seconds = outcome(row)
        if strategy.get("incumbent") and seconds > incumbent:
            compute += incumbent  # stopped when its clock passed the incumbent's time to target
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        stopped_at = None
        for step, (at, _, metric) in enumerate(row["curve"]):
            # an error, so that lower is better like the study's value
            trial.report(1.0 - metric, step)
            if trial.should_prune():
                stopped_at = at
                break
        if stopped_at is not None:
            compute += stopped_at
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        compute += seconds
        trial.set_constraint("target", 0.0 if row["reached"] else 1.0)
        study.tell(trial, seconds)
        if row["reached"] and seconds < incumbent:
            incumbent = seconds
            improvements.append((number + 1, compute, true_time(runs)))
    return {
        "seed": seed,
        "compute": compute,
        "best": improvements[-1][2] if improvements else None,
        "improvements": improvements,
    }


# Whole studies at the shipped budget, replayed: the search above, then the study's choice of a
# winner. `replicates`: a trial whose first run beats the best so far runs that many in all (other
# seeds of its configuration), its time their mean; `confirm`: the best that many trials and the
# baseline each run `CONFIRM_RUNS` more times and the lowest median wins, else the fastest trial
# does.
CONFIRM_RUNS = 3
STUDIES: dict[str, dict[str, Any]] = {
    "plain TPE": {
        "sampler": lambda seed, trials: optuna.samplers.TPESampler(seed=seed),
        "plain": True,
    },
    "autotune, one run per trial": {**STRATEGIES["autotune+incumbent+probe"], "confirm": 3},
    "autotune as shipped (replicates 3)": {
        **STRATEGIES["autotune+incumbent+probe"],
        "replicates": 3,
        "confirm": 3,
    },
    "as shipped, no confirmation": {**STRATEGIES["autotune+incumbent+probe"], "replicates": 3},
    "as shipped + first_trial: baseline": {
        **STRATEGIES["autotune+incumbent+probe"],
        "replicates": 3,
        "confirm": 3,
        "first_trial": "baseline",
    },
}


def replay_study(
    grid: dict[str, list[dict[str, Any]]],
    *,
    strategy: dict[str, Any],
    seed: int,
    trials: int,
    baseline: dict[str, Any],
    probed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One study of `trials` trials as `strategy` runs it, to its reported winner: the winner's
    configuration key, its compute (trials, replicates and confirmation runs), and whether the
    baseline was kept. Runs are drawn from the grid as in `replay`."""
    draw = random.Random(seed)
    study = optuna.create_study(direction="minimize", sampler=strategy["sampler"](seed, trials))
    prune, replicates = strategy.get("incumbent", False), strategy.get("replicates", 1)
    incumbent = math.inf
    compute, space = searched_space(strategy, probed)
    if strategy.get("first_trial") == "baseline" and all(baseline[k] in space[k] for k in space):
        study.enqueue_trial(baseline)
    for _ in range(trials):
        trial = study.ask()
        config = {name: trial.suggest_categorical(name, values) for name, values in space.items()}
        first, *others = draw.sample(grid[key(config)], len(grid[key(config)]))
        # as the study does: one run, and the others only for a first run that beats the best so
        # far; pruned once the runs' time passes the planned runs' share of the best
        planned = replicates if first["reached"] and outcome(first) < incumbent else 1
        taken = [first, *others[: planned - 1]]
        spent = sum(outcome(row) for row in taken)
        if prune and spent > incumbent * planned:
            compute += incumbent * planned
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        compute += spent
        reached = all(row["reached"] for row in taken)
        trial.set_user_attr("reached", reached)
        if strategy.get("plain"):  # a hand-written loop: a miss is infinitely slow, no constraint
            study.tell(trial, spent / len(taken) if reached else math.inf)
            continue
        trial.set_constraint("target", 0.0 if reached else 1.0)
        study.tell(trial, spent / len(taken))
        if reached:
            incumbent = min(incumbent, spent / len(taken))
    feasible = sorted(
        (t for t in study.trials if t.value is not None and t.user_attrs["reached"]),
        key=lambda t: (t.value, t.number),
    )
    top = [key(t.params) for t in feasible]
    found = {"seed": seed, "first": key(study.trials[0].params)}
    if not strategy.get("confirm"):
        return {
            **found,
            "compute": compute,
            "winner": top[0] if top else key(baseline),
            "kept_baseline": not top,
        }
    candidates = [key(baseline)] + [
        k for k in dict.fromkeys(top[: strategy["confirm"]]) if k != key(baseline)
    ]
    medians = {}
    for k in candidates:
        rows = draw.sample(grid[k], min(CONFIRM_RUNS, len(grid[k])))
        compute += sum(outcome(row) for row in rows)
        medians[k] = true_time(rows)
    won = min(candidates, key=lambda k: (medians[k], k != key(baseline)))
    return {**found, "compute": compute, "winner": won, "kept_baseline": won == key(baseline)}


def median_or_inf(values: list[float | None]) -> float:
    return statistics.median(math.inf if v is None else v for v in values)


def first_within(
    improvements: list[tuple[int, float, float]], limit: float
) -> tuple[int, float] | None:
    """(trials, compute) when the configuration the search would report first came within `limit`
    seconds (by its true time); None if never."""
    return next(((n, c) for n, c, best in improvements if best <= limit), None)


def main() -> None:
    args = arguments()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    header, grid = load_grid(args.grid)
    configs = 1
    for values in GRID.values():
        configs *= len(values)
    if len(grid) < configs:
        sys.exit(
            f"{args.grid} holds {len(grid)} of the grid's {configs} configurations: "
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
    probed, baseline = measure_probe()
    from autotune.search.probe import describe

    print(describe(probed))
    runs, summary = searches(args, grid, probed, optimum)
    study_summary = whole_studies(args, grid, probed, baseline, truth, optimum)
    record = {
        "benchmark": "search",
        "args": {k: str(v) for k, v in vars(args).items()},
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
    out = RESULTS / args.grid.name.replace("grid-", "search-").replace(".jsonl", ".json")
    out.write_text(json.dumps(record, indent=1))
    print(f"written: {out.relative_to(REPO)}")


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
    return parser.parse_args()


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


if __name__ == "__main__":
    main()
