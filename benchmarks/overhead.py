"""What the tuner costs per trial outside training: storage, sampling, the trial's set-up and
evaluation, and with process isolation the child's start, on a trivial task.

Runs whole studies (autotune's own loop, SQLite storage) of `--trials` trials on
benchmarks/trivial.py, in-process and with isolation: process, alternating, `--rounds` times
after one warm-up round each. The tuner's time is the study's wall time less its trials'
training clocks; studies of two sizes (5 and 20 trials) split it into the cost of one more
trial (their difference) and the once-per-study start (opening the storage, building the
task). Usage (from the repository root):

    .venv/bin/python benchmarks/overhead.py [--trials 5 20] [--rounds 5] [--epochs 1]

Prints a table and writes benchmarks/results/overhead-<device>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna
import torch

# Progress bars would be measured too (read when tqdm is imported).
os.environ.setdefault("TQDM_DISABLE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # so that benchmarks.trivial imports, here and in trial processes

from autotune.record import schema
from autotune.spec import study_file
from autotune.study import preparation
from autotune.study.run import run_sequence
from benchmarks.provenance import RESULTS, provenance

MODES = ("none", "process", "warm")


def run_study(
    folder: Path, *, mode: str, trials: int, epochs: float, index: int
) -> dict[str, float]:
    """One study from scratch; its wall time and its trials' training clocks."""
    raw = {
        "name": f"overhead-{mode}-{index}",
        "task": "benchmarks.trivial:task",
        "isolation": mode,
        # Each trial trains its whole schedule: `epochs`, whatever it reaches.
        "target": {"metric": "accuracy", "value": 0.5},
        "objective": "fixed_schedule",
        "replicates": 1,
        "prune": "none",
        "space": {
            "data_on_device": False,
            "num_workers": 0,
            "precision": "fp32",
            "batch_size": [32, 64],
            "accumulation_steps": [1, 2],
            "schedule_epochs": epochs,
        },
        "budget": {"trials": trials, "max_epochs": epochs, "eval_every": epochs},
        "confirm": {"top": 0},
    }
    spec = study_file.from_mapping(
        raw, path=folder / "overhead.yaml", storage=f"sqlite:///{folder / f'{mode}-{index}.db'}"
    )
    prepared = preparation.prepare(spec)
    started = time.perf_counter()
    study = run_sequence(spec, prepared)
    wall = time.perf_counter() - started
    train = sum(
        schema.measured(t)["train_seconds"] for t in study.get_trials() if t.state.is_finished()
    )
    return {
        "wall": wall,
        "train": train,
        "per_trial_wall": wall / trials,
        "per_trial_train": train / trials,
        "overhead_per_trial": (wall - train) / trials,
        "overhead_fraction": (wall - train) / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trials",
        type=int,
        nargs=2,
        default=[5, 20],
        metavar=("SMALL", "LARGE"),
        help="the trials of the two study sizes whose difference gives the cost of one more trial",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write it")
    args = parser.parse_args()
    os.chdir(REPO)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    small, large = sorted(args.trials)

    samples: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds + 1):  # round 0 warms up imports, caches and the fork server
            for mode in MODES:
                pair = {
                    n: run_study(
                        Path(tmp),
                        mode=mode,
                        trials=n,
                        epochs=args.epochs,
                        index=2 * index + (n == large),
                    )
                    for n in (small, large)
                }
                if index > 0:
                    samples[mode].append(
                        {
                            "small": pair[small],
                            "large": pair[large],
                            **split(pair[small], pair[large], small, large),
                        }
                    )

    keys = ("per_trial", "per_study", "all_in_per_trial")
    summary = {
        mode: {key: statistics.median(s[key] for s in runs) for key in keys}
        for mode, runs in samples.items()
    }
    print(
        f"studies of {small} and {large} trials, {args.rounds} of each per mode, interleaved; "
        "medians"
    )
    print(
        f"{'isolation':<10} {'per trial':>10} {'per study (start)':>18} "
        f"{f'all in, per trial of {large}':>26}"
    )
    for mode, s in summary.items():
        print(
            f"{mode:<10} {s['per_trial']:>9.3f}s {s['per_study']:>17.3f}s "
            f"{s['all_in_per_trial']:>25.3f}s"
        )

    record = {
        "benchmark": "overhead",
        "args": {k: v for k, v in vars(args).items() if k != "results"},
        **provenance(torch.device("cpu")),
        "summary": summary,
        "samples": samples,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "overhead-cpu.json"
    out.write_text(json.dumps(record, indent=2))
    print(f"written: {out}")


def split(
    small: dict[str, float], large: dict[str, float], n_small: int, n_large: int
) -> dict[str, float]:
    """The tuner's time outside training, split into the cost of one more trial (the difference
    between the two studies) and the cost of starting a study (what is left of the small one)."""
    outside_small = small["wall"] - small["train"]
    outside_large = large["wall"] - large["train"]
    per_trial = (outside_large - outside_small) / (n_large - n_small)
    return {
        "per_trial": per_trial,
        "per_study": outside_small - n_small * per_trial,
        "all_in_per_trial": outside_large / n_large,
    }


if __name__ == "__main__":
    main()
