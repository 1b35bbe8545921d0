"""One study of benchmarks/found.py: run as `autotune run` would, then its winner re-measured
beside the baseline (and the measured grid's oracle) on fresh seeds."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

from autotune.record import verdict
from autotune.search.space import FORMAT_KNOBS, LOADER_KNOBS, Choices, Space
from autotune.spec.checks import read_yaml
from autotune.spec.study_file import FIXED_SCHEDULE, SYSTEMS_ONLY, StudySpec, from_mapping
from autotune.study import confirm, preparation
from benchmarks.arms import autotune_study, plain_tpe_study
from benchmarks.found_report import keeps_baseline
from benchmarks.grid import load_grid, true_time

REMEASURE_SEED = 7_000_000  # far from every seed a study uses (study seed * 100,000 + ...)
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
        row.update(against_oracle(stats, variants, won=won, grid_median=grid_median))
    if not to_target:
        row.update(fixed_schedule(runs, target=spec.target.value))
    return row


def against_oracle(
    stats: dict, variants: dict[str, dict], *, won: float | None, grid_median: float
) -> dict:
    """A study's figures beside the oracle: the fastest of its variants as re-measured, and the
    winner's regret over it (infinite where the winner missed and the oracle did not)."""
    medians = {label: stats[label]["median"] for label in variants}
    label = min(medians, key=lambda v: math.inf if medians[v] is None else medians[v])
    best = medians[label]
    return {
        "oracle": variants[label],
        "oracle_median": best,
        "oracle_grid_median": grid_median,
        "oracle_variants": medians,
        "regret": won / best if won and best else None if best is None else math.inf,
    }


def fixed_schedule(runs: list[dict], *, target: float) -> dict:
    """The fixed-schedule yardstick: whole-schedule time, counted only where the mean final metric
    reaches the target."""
    fixed = verdict.stats(runs, objective=FIXED_SCHEDULE, target=target)
    fixed_base, fixed_won = fixed[verdict.BASELINE]["median"], fixed["winner"]["median"]
    return {
        "fixed_stats": fixed,
        "fixed_speedup": fixed_base / fixed_won if fixed_base and fixed_won else None,
    }
