"""The replays benchmarks/search.py runs: a search, or a whole study, against the measured grid.

A trial's outcome is looked up in the grid (benchmarks/grid.py) instead of trained: one of its
configuration's measured runs, drawn at random, as a real trial is one noisy run. STRATEGIES are
the searches compared, STUDIES the whole studies, each a dict of what it uses (sampler, pruning,
the probe, replicates, confirmation).
"""

from __future__ import annotations

import math
import random
from typing import Any

import optuna

from autotune.study.sampler import tpe_sampler
from benchmarks.grid import GRID, key, true_time


def outcome(row: dict[str, Any]) -> float:
    """What the study minimizes: time to target, or the time spent when the target was missed."""
    return row["time_to_target"] if row["reached"] else row["train_seconds"]


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


def searched_space(
    strategy: dict[str, Any], probed: dict[str, Any] | None
) -> tuple[float, dict[str, list]]:
    """The compute a search starts with and the grid space it searches: after a probe (with a
    strategy that probes), its seconds spent and the loader setting and precisions it settled."""
    space = dict(GRID)
    if not strategy.get("probe"):
        return 0.0, space
    # a probe that settled nothing leaves the loader to the search
    if "num_workers" in probed["loader"]:
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
