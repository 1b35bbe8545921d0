"""Per-trial cost of running a trial in a child process, against running it in this process.

Runs one configuration of a task alternately in-process, in a fresh child (isolation: process) and
in a child kept warm between trials (isolation: warm), interleaved so both see the same machine
load, and reports the median wall time each spends outside the training clock. Usage:

    .venv/bin/python benchmarks/isolation_overhead.py [--task digits] [--runs 7] [--device cpu]

Prints a table and writes benchmarks/results/isolation_overhead-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from autotune.runners import isolation, warm
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from autotune.train.measure import device_name
from autotune.train.tasks import load_task

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write it")
    args = parser.parse_args()

    device = torch.device(args.device)
    config = TrialConfig.from_mapping(complete(DEFAULT_BASELINE))
    # The target is out of reach, so every run trains the same fixed number of epochs.
    limits = Limits(target=2.0, max_epochs=args.epochs, max_seconds=600, eval_every=0.25)
    runners = {
        "in-process": isolation.in_process(load_task(args.task)),
        "child process": isolation.in_child(
            args.task, study_path=Path("benchmark.yaml"), hang_after=600
        ),
        "warm child": warm.WarmChild(
            args.task, study_path=Path("benchmark.yaml"), hang_after=600, measure_hang_after=600
        ).run_trial,
    }
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for run_index in range(
        args.runs + 1
    ):  # the first round warms up both (and starts the fork server)
        for name, run_trial in runners.items():
            started = time.perf_counter()
            result = run_trial(config, limits=limits, device=device, seed=run_index)
            wall = time.perf_counter() - started
            if run_index > 0:
                samples[name].append(
                    {
                        "wall": wall,
                        "train": result.train_seconds,
                        "outside": wall - result.train_seconds,
                    }
                )

    summary = {
        name: {key: statistics.median(s[key] for s in runs) for key in ("wall", "train", "outside")}
        for name, runs in samples.items()
    }
    here = summary["in-process"]
    extra = {
        name: row["wall"] - here["wall"] for name, row in summary.items() if name != "in-process"
    }
    print(
        f"task {args.task}, {args.epochs:g} epoch(s) of the baseline, {device_name(device)}, "
        f"median of {args.runs}"
    )
    print(f"{'':<14} {'wall s':>8} {'training s':>11} {'outside training s':>19}")
    for name, row in summary.items():
        print(f"{name:<14} {row['wall']:>8.3f} {row['train']:>11.3f} {row['outside']:>19.3f}")
    for name, added in extra.items():
        row = summary[name]
        print(
            f"a {name} adds {added:.3f} s of wall time a trial "
            f"({added / here['wall']:.0%} of an in-process trial): "
            f"{row['outside'] - here['outside']:.3f} s outside training and "
            f"{row['train'] - here['train']:.3f} s on the training clock"
        )

    args.results.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = args.results / f"isolation_overhead-{device.type}-{args.epochs:g}ep.json"
    out.write_text(
        json.dumps(
            {
                "task": args.task,
                "epochs": args.epochs,
                "runs": args.runs,
                "device": device_name(device),
                "machine": platform.node(),
                "torch": torch.__version__,
                "commit": commit,
                "summary": summary,
                "extra_wall_seconds_per_trial": extra,
                "samples": samples,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
