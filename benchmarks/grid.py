"""Measure every configuration of a discretized search space on the digits task, once.

The table this writes is what benchmarks/search.py replays searches against: for each
configuration, its time to target, whether it got there, its best metric, its throughput and its
learning curve, from real training runs under the digits study's limits (studies/digits.yaml).
Every configuration runs once per `--seed`, all with the same seed in one pass (common random
numbers: the same initial weights and augmentation draws), in a shuffled order so that a change
in the machine's load spreads over the grid instead of following one knob.

Resumable: rows already in the file (same seed and configuration) are kept and skipped. Usage
(from the repository root):

    .venv/bin/python benchmarks/grid.py [--seed 12345 [12346 ...]]
                                        [--out benchmarks/results/grid-digits-cpu.jsonl]

Seeds run one whole pass after another. The first line of the file says how it was made; each
further line is one run of one configuration, with its seed and the commit that measured it. Run
it on a quiet machine: its times are the ground truth the search benchmarks are judged by.
`--results DIR` writes grid-digits-cpu.jsonl there instead (`--out` names the file itself);
`--configs N` and `--max-seconds S` make a smoke run: the first N configurations of each pass,
each run's training clock cut at S seconds (the file's first line records the limits).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from autotune.runners import isolation
from autotune.spec import study_file
from autotune.study.preparation import limits_for
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import load_task
from autotune.train.trial import run
from benchmarks.provenance import REPO, RESULTS, provenance

# The discretized space: 4 x 3 x 4 x 2 x 2 x 2 = 384 configurations. Loader workers and precision
# are in it so that a search can waste trials on them; prefetch_factor is 2 wherever it exists.
GRID = {
    "lr": [0.01, 0.03, 0.1, 0.3],
    "scheduler": ["constant", "cosine", "onecycle"],
    "batch_size": [16, 32, 64, 128],
    "accumulation_steps": [1, 2],
    "num_workers": [0, 1],
    "precision": ["fp32", "bf16"],
}
SEED = 12345  # one seed for every configuration
ORDER_SEED = 0
FILE_NAME = "grid-digits-cpu.jsonl"


def configurations() -> list[dict]:
    configs = []
    for values in itertools.product(*GRID.values()):
        config = dict(zip(GRID, values))
        config.update(prefetch_factor=2 if config["num_workers"] else None, pin_memory=False)
        configs.append(config)
    return configs


def key(config: dict) -> str:
    return json.dumps({k: config[k] for k in GRID}, sort_keys=True)


def load_grid(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """The grid's header, and every configuration's runs (one per seed it was measured with)."""
    lines = path.read_text().splitlines()
    grid: dict[str, list[dict[str, Any]]] = {}
    for row in map(json.loads, lines[1:]):
        grid.setdefault(key(row["config"]), []).append(row)
    return json.loads(lines[0]), grid


def true_time(runs: list[dict[str, Any]]) -> float:
    """A configuration's time to target as the benchmarks judge it: the median over its runs, a
    run that missed the target counting as infinitely slow (so a lucky run alone is not enough)."""
    return statistics.median(r["time_to_target"] if r["reached"] else math.inf for r in runs)


def main() -> None:
    args = arguments()
    spec = study_file.load(REPO / "studies" / "digits.yaml")
    limits = limits_for(spec)
    if args.max_seconds is not None:
        limits = dataclasses.replace(limits, max_seconds=args.max_seconds)
    device = torch.device("cpu")
    isolation.warm_up()
    task = load_task(spec.task, study_path=spec.path)
    done = start(args.out, seeds=args.seed, limits=limits, device=device)
    commit = provenance(device)["commit"]

    for seed in args.seed:
        todo = [c for c in configurations() if (seed, key(c)) not in done]
        random.Random(ORDER_SEED).shuffle(todo)
        print(
            f"seed {seed}: {len(configurations()) - len(todo)} configurations measured, "
            f"{len(todo)} to go",
            flush=True,
        )
        if args.configs is not None and args.configs < len(todo):
            print(f"running the first {args.configs} of them (--configs)", flush=True)
        todo = todo[: args.configs]
        for index, config in enumerate(todo, 1):
            result = run(
                task, TrialConfig.from_mapping(config), limits=limits, device=device, seed=seed
            )
            row = {
                "config": config,
                "seed": seed,
                "reached": result.reached,
                "time_to_target": result.time_to_target,
                "train_seconds": result.train_seconds,
                "best_metric": result.best_metric,
                "epochs": result.epochs,
                "samples_to_target": result.samples_to_target,
                "samples_per_second": result.samples_per_second,
                "stop_reason": result.stop_reason,
                "curve": [list(point) for point in result.curve],
                "commit": commit,
            }
            with args.out.open("a") as out:
                out.write(json.dumps(row) + "\n")
            outcome = (
                f"{result.time_to_target:.2f} s"
                if result.reached
                else f"missed ({result.best_metric:.3f})"
            )
            print(f"{index}/{len(todo)} {key(config)} -> {outcome}", flush=True)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=RESULTS, metavar="DIR", help="where to write it"
    )
    parser.add_argument(
        "--out", type=Path, help=f"the file itself (default: {FILE_NAME} in --results)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        default=[SEED],
        help="each seed adds a run of every configuration",
    )
    parser.add_argument(
        "--configs", type=int, metavar="N", help="only the first N configurations of each pass"
    )
    parser.add_argument(
        "--max-seconds", type=float, metavar="S", help="each run's training clock, not the study's"
    )
    args = parser.parse_args()
    args.out = args.out or args.results / FILE_NAME
    return args


def start(
    out: Path, *, seeds: list[int], limits: Limits, device: torch.device
) -> set[tuple[int, str]]:
    """The (seed, configuration) pairs the file already holds; a new file gets its header."""
    if out.exists():
        header, grid = load_grid(out)
        held, now = header.get("limits") or {}, dataclasses.asdict(limits)
        if any(now.get(name) != value for name, value in held.items()):
            # rows under other limits (--max-seconds) would join the ground truth unseen
            raise SystemExit(
                f"grid: {out} holds runs under other limits ({held}); give --out a new file"
            )
        return {(row.get("seed", SEED), name) for name, runs in grid.items() for row in runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "benchmark": "grid",
        "task": "digits",
        "study": "studies/digits.yaml",
        "grid": GRID,
        "seed": seeds,
        "limits": dataclasses.asdict(limits),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        **provenance(device),
    }
    out.write_text(json.dumps(header) + "\n")
    return set()


if __name__ == "__main__":
    main()
