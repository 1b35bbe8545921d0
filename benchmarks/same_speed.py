"""Does a change leave one trial's training as fast as before? This checkout against another
revision, the same trial on the same device, side by side.

Each round trains the same configuration (a built-in task's baseline, or --config's settings)
for a fixed amount of work (the target out of reach, --epochs epochs) once with each tree, in a
fresh process each, the order alternating between rounds. A process imports only its own tree's
autotune (PYTHONPATH), so the code measured is the revision's, and the timing is the training
clock each run reports, read by this script: no code of either tree judges itself.

    .venv/bin/python benchmarks/same_speed.py --base REV [--task digits] [--rounds 5]
                                              [--epochs 1] [--device auto] [--config JSON]
                                              [--results DIR]

Prints both trees' samples a second (median, min-max over rounds) and their ratio, and writes
benchmarks/results/same_speed-<task>-<device>.json. On a GPU:
`python benchmarks/same_speed.py --base REV --task shapes --epochs 0.5`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.provenance import RESULTS  # noqa: E402

# Run in each tree's own process: one trial of fixed work, its figures as one JSON line.
TRIAL = """
import json, sys
import torch
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import load_task
from autotune.train.trial import run

task_name, device, epochs, overrides = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
device = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                      "cpu" if device == "auto" else device)
config = TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, **json.loads(overrides)}))
limits = Limits(target=2.0, max_epochs=epochs, max_seconds=3600, eval_every=epochs)
result = run(load_task(task_name), config, limits=limits, device=device, seed=0)
print(json.dumps({"device": device.type, "train_seconds": result.train_seconds,
                  "samples_per_second": result.samples_per_second}))
"""


def tree_of(revision: str, folder: Path) -> Path:
    """`revision`'s files (git archive) in `folder`."""
    archive = folder / "base.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), revision], cwd=REPO, check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "tree", filter="data")
    return folder / "tree"


def one_run(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "TQDM_DISABLE": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", TRIAL, args.task, args.device, str(args.epochs), args.config],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if ran.returncode != 0:
        raise SystemExit(f"a run in {tree} failed:\n{ran.stderr[-3000:]}")
    return json.loads(ran.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (git)")
    parser.add_argument("--task", default="digits")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--config", default="{}", help="knobs over the baseline, as JSON")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "this checkout": []}
    with tempfile.TemporaryDirectory() as folder:
        trees = {"base": tree_of(args.base, Path(folder)), "this checkout": REPO}
        for index in range(args.rounds):
            order = list(trees) if index % 2 == 0 else list(reversed(trees))
            for name in order:
                runs[name].append(one_run(trees[name], args))
                print(f"round {index + 1}: {name} {runs[name][-1]}", flush=True)
    speeds = {name: [r["samples_per_second"] for r in rs] for name, rs in runs.items()}
    medians = {name: statistics.median(s) for name, s in speeds.items()}
    ratio = medians["this checkout"] / medians["base"]
    for name, values in speeds.items():
        print(
            f"{name:>14}: {medians[name]:,.0f} samples/s "
            f"(min-max {min(values):,.0f}-{max(values):,.0f}, {len(values)} runs)"
        )
    print(f"this checkout / base: {ratio:.3f}")
    device = runs["base"][0]["device"]
    out = args.results / f"same_speed-{args.task.replace(':', '.')}-{device}.json"
    record = {"base": args.base, "args": {**vars(args), "results": str(args.results)}}
    record.update(runs=runs, ratio=ratio)
    out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
