"""Does a shorter LR schedule reach the digits target sooner? (Evidence for the next knob.)

Every autotune trial's schedule spans the study's `max_epochs` (8 for digits), while the target
is reached after 2-5 epochs, when a cosine or one-cycle schedule has barely begun to anneal. This
runs a few fast-learning configurations with schedules of 1-3 epochs beside the baseline (8
epochs, constant), interleaved over `--seeds` seeds, and prints each one's median time to target
and how many seeds reached it. Usage (from the repository root):

    .venv/bin/python benchmarks/schedule_length.py [--seeds 5] [--max-seconds S]

`--max-seconds S` cuts each run's training clock at S seconds (the study's: 12): a smoke run.
Writes benchmarks/results/schedule_length-digits-cpu.json (--results: another folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from autotune.runners import isolation  # noqa: E402
from autotune.search.space import DEFAULT_BASELINE  # noqa: E402
from autotune.spec import study_file
from autotune.study.preparation import limits_for  # noqa: E402
from autotune.train.config import TrialConfig
from autotune.train.tasks import load_task  # noqa: E402
from autotune.train.trial import run  # noqa: E402
from benchmarks.provenance import REPO, RESULTS, provenance  # noqa: E402

SEED = 3_000_000  # seeds no study uses
CANDIDATES = {  # label: (changes to the baseline, schedule length in epochs)
    "baseline (constant, 8 epochs)": ({}, None),
    **{
        f"onecycle lr 0.2 batch 32, {e} epochs": ({"lr": 0.2, "scheduler": "onecycle"}, e)
        for e in (1, 2, 3)
    },
    **{
        f"onecycle lr 0.3 batch 64, {e} epochs": (
            {"lr": 0.3, "batch_size": 64, "scheduler": "onecycle"},
            e,
        )
        for e in (1, 2, 3)
    },
    **{
        f"cosine lr 0.3 batch 64, {e} epochs": (
            {"lr": 0.3, "batch_size": 64, "scheduler": "cosine"},
            e,
        )
        for e in (2, 3)
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--max-seconds",
        type=float,
        metavar="S",
        help="each run's training clock, not the study's (a smoke run: the test suite's)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write it")
    args = parser.parse_args()
    spec = study_file.load(REPO / "studies" / "digits.yaml")
    limits = limits_for(spec)
    if args.max_seconds is not None:
        limits = dataclasses.replace(limits, max_seconds=args.max_seconds)
    device = torch.device("cpu")
    isolation.warm_up()
    task = load_task("digits")
    times: dict[str, list[float]] = {label: [] for label in CANDIDATES}
    for seed in range(SEED, SEED + args.seeds):
        for label, (changes, epochs) in CANDIDATES.items():
            mine = limits if epochs is None else dataclasses.replace(limits, max_epochs=epochs)
            result = run(
                task,
                TrialConfig.from_mapping({**DEFAULT_BASELINE, **changes}),
                limits=mine,
                device=device,
                seed=seed,
            )
            times[label].append(result.time_to_target if result.reached else math.inf)
    base = statistics.median(times[next(iter(CANDIDATES))])
    summary = {}
    print(f"digits to {limits.target}, {args.seeds} seeds each, interleaved")
    print(f"{'configuration':<36} {'median (s)':>10} {'reached':>8} {'vs baseline':>12}")
    for label, values in times.items():
        median = statistics.median(values)
        reached = sum(math.isfinite(v) for v in values)
        summary[label] = {
            "median": median if math.isfinite(median) else None,
            "reached": reached,
            "times": [v if math.isfinite(v) else None for v in values],
        }
        ratio = f"{base / median:.2f}x" if math.isfinite(median) else "-"
        print(f"{label:<36} {median:>10.2f} {reached:>5}/{args.seeds} {ratio:>12}")
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "schedule_length-digits-cpu.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "schedule_length",
                "seeds": args.seeds,
                "max_seconds": limits.max_seconds,
                **provenance(device),
                "summary": summary,
            },
            indent=1,
        )
    )
    print(f"written: {out}")


if __name__ == "__main__":
    main()
