"""Where a trial's speed goes: the trial loop beside its step alone, for one systems setting.

The joint probe predicts a setting's speed from its loader's rate and its step's, measured apart.
This trains the same setting with the trial loop itself (autotune's `train.trial.run`, one run
each, 1.5 epochs by default, the target out of reach so that every run trains as long):

- activation checkpointing off and on: it recomputes each block's forward, what the probe does not
  measure;
- evaluating every quarter epoch (the clock paused, the loader's workers filling their queue
  meanwhile) and only at the end (the loader's steady rate, start-up included);

for the setting the probe chose on the shapes study on an H100 (16 workers, fp16, channels-last,
the fused step, batch 512) and for the expert recipe (bf16, pinned, prefetch 2, cuDNN's search),
then each step's rate alone (probe/rates.py), side by side. Each run's rate between evaluations
is listed segment by segment: the first holds the start-up, and those across an epoch's start
wait for the workers to begin it.

    python benchmarks/trial_rates.py [--cpu] [--epochs 1.5] [--results DIR]

--cpu: the digits task with 2 workers at batch 64 in fp32 (the plumbing, in seconds). Writes
benchmarks/results/trial_rates-<task>-<device>.json as it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from autotune.probe import rates  # noqa: E402
from autotune.search.space import complete  # noqa: E402
from autotune.train import trial  # noqa: E402
from autotune.train.config import Limits, TrialConfig  # noqa: E402
from autotune.train.tasks import load_task  # noqa: E402
from benchmarks.provenance import RESULTS, provenance  # noqa: E402

CHOSEN = {
    "lr": 0.16,
    "scheduler": "onecycle",
    "batch_size": 512,
    "accumulation_steps": 1,
    "num_workers": 16,
    "prefetch_factor": 4,
    "pin_memory": False,
    "precision": "fp16",
    "schedule_epochs": 10.0,
    "channels_last": True,
    "compile": False,
    "cudnn_benchmark": False,
    "tf32": False,
    "fused_optimizer": True,
    "checkpointing": False,
}
EXPERT = {
    **CHOSEN,
    "lr": 0.2,
    "precision": "bf16",
    "pin_memory": True,
    "prefetch_factor": 2,
    "cudnn_benchmark": True,
    "fused_optimizer": False,
}
# what a CPU runs of them: the plumbing only
ON_CPU = {"batch_size": 64, "num_workers": 2, "precision": "fp32", "channels_last": False}
EVERY = {"every quarter epoch": 0.25, "at the end only": 1e6}  # epochs between evaluations
UNREACHABLE = 2.0  # no accuracy reaches it: every run trains its whole length


def settings(cpu: bool) -> dict[str, dict[str, Any]]:
    """Each setting by name, as this device runs it."""
    named = {
        "chosen": CHOSEN,
        "chosen, checkpointing": {**CHOSEN, "checkpointing": True},
        "expert": EXPERT,
    }
    if cpu:
        named = {
            k: {**v, **ON_CPU, "fused_optimizer": False, "cudnn_benchmark": False}
            for k, v in named.items()
        }
    return named


def trial_run(task: Any, config: dict[str, Any], every: float, *, epochs: float, device) -> dict:
    """One run of the trial loop: its clock, its rate after warm-up, and its rate between each
    pair of evaluations (samples a second of the training clock)."""
    limits = Limits(
        target=UNREACHABLE,
        max_epochs=epochs,
        max_seconds=120,
        eval_every=every,
        stop_at_target=False,
    )
    started = time.perf_counter()
    result = trial.run(
        task, TrialConfig.from_mapping(complete(config)), limits=limits, device=device, seed=1
    )
    points = [(0.0, 0.0)] + [(seconds, done) for seconds, done, _ in result.curve]
    samples = len(task.train)
    return {
        "train_seconds": result.train_seconds,
        "epochs": result.epochs,
        "samples_per_second": result.samples_per_second,
        "segments": [
            (e2 - e1) * samples / (s2 - s1) for (s1, e1), (s2, e2) in zip(points, points[1:])
        ],
        "wall_seconds": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="digits on the CPU: the plumbing")
    parser.add_argument("--epochs", type=float, default=1.5)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    task_name = "digits" if args.cpu else "shapes"
    device = torch.device("cpu" if args.cpu else "cuda")
    task = load_task(task_name)
    out = args.results / f"trial_rates-{task_name}-{device.type}.json"
    record: dict[str, Any] = {"provenance": provenance(device), "runs": {}, "step_alone": {}}

    def save() -> None:
        out.write_text(json.dumps(record, indent=2) + "\n")

    named = settings(args.cpu)
    for name, config in named.items():
        for when, every in EVERY.items():
            run = trial_run(task, config, every, epochs=args.epochs, device=device)
            record["runs"][f"{name}, evaluated {when}"] = run
            print(
                f"{name}, evaluated {when}: {run['train_seconds']:.2f} s, "
                f"segments {', '.join(f'{s:,.0f}' for s in run['segments'])} /s",
                flush=True,
            )
            save()
    alone = rates.measure(
        task,
        {},
        {name: TrialConfig.from_mapping(complete(c)) for name, c in named.items()},
        device=device,
        seed=1,
    )
    for name, rate in alone.items():
        record["step_alone"][name] = rate.as_json()
        print(f"{name}, step alone: {rate.samples_per_second:,.0f}/s", flush=True)
    save()


if __name__ == "__main__":
    main()
