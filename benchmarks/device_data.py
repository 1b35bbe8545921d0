"""The training set on the device against a DataLoader, side by side: one configuration's maths
trained to its study's target with its batches made each way, by the plain-PyTorch module
`autotune export --format torch` writes (the roofline benchmark's judge, not autotune's loop).

Arms: a DataLoader with no workers, one with as many workers as the cores (pinned on CUDA), and
`data_on_device`, on the same maths. Each seed runs every arm, in an order that turns from seed
to seed; the seeds are fresh. A process's first steps are taken untimed before the first run.
The exported module draws augmentations from torch's random numbers (a worker's own, or the
main process's), so the arms' runs need different samples to the target on one seed: the speed
compared is each run's samples a second over its run, start-up included, seed by seed; the time
to the target is given beside it.

    .venv/bin/python benchmarks/device_data.py [--study studies/digits.yaml] [--seeds 5]
                                               [--expert] [--results DIR]

`--expert`: the roofline benchmark's expert recipe's maths and loader (bf16, channels-last,
cuDNN's search, batch up to 512, onecycle) instead of the study's baseline. Prints each arm's
samples a second and time to the target (median, min-max over runs), its speed over the workers'
DataLoader's (median over seeds of the per-seed ratio, min-max), and writes
benchmarks/results/device-data-<study>-<device>.json. On a GPU:
`python3 benchmarks/device_data.py --study studies/shapes.yaml --expert`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autotune.search.space import NO_LOADER, complete  # noqa: E402
from autotune.spec import study_file  # noqa: E402
from autotune.study import preparation  # noqa: E402
from autotune.train.measure import cpu_count  # noqa: E402
from benchmarks import roofline_judge  # noqa: E402
from benchmarks.provenance import RESULTS, provenance  # noqa: E402

FIRST_SEED = 7_000  # fresh: no study's trials or confirmations use seeds from here


def arms(maths: dict[str, Any], *, cuda: bool) -> dict[str, dict[str, Any]]:
    """The three ways to make `maths`'s batches."""
    workers = {"num_workers": cpu_count(), "prefetch_factor": 2, "pin_memory": cuda}
    return {
        "loader, no workers": complete({**maths, **NO_LOADER, "data_on_device": False}),
        f"loader, {cpu_count()} workers": complete({**maths, **workers, "data_on_device": False}),
        "data on the device": complete({**maths, **NO_LOADER, "data_on_device": True}),
    }


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "range": [min(values), max(values)]}


def summarized(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """An arm's runs: speed (samples over the run's seconds), its ratio to `theirs` seed by seed,
    and time to the target over the runs that reached it (None: none did)."""
    speeds = [r["samples"] / r["seconds"] for r in ours]
    times = [r["time_to_target"] for r in ours if r["reached"]]
    return {
        "samples_per_second": spread(speeds),
        "speed_ratio": spread(
            [speed / (r["samples"] / r["seconds"]) for speed, r in zip(speeds, theirs)]
        ),
        "time_to_target": spread(times) if times else None,
        "reached": f"{sum(r['reached'] for r in ours)}/{len(ours)}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "digits.yaml")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--expert", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    spec = study_file.load(args.study)
    prepared = preparation.prepare(spec)
    maths = roofline_judge.expert(prepared) if args.expert else complete(prepared.baseline)
    configs = arms(maths, cuda=prepared.device.type == "cuda")
    template = roofline_judge.export_template(spec, prepared)
    # untimed: what the process's first steps load lands on no arm
    roofline_judge.judge_run(
        template, configs["loader, no workers"], prepared, spec, 0, max_steps=3
    )
    names = list(configs)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for index in range(args.seeds):
        order = names[index % len(names) :] + names[: index % len(names)]
        for name in order:
            run = roofline_judge.judge_run(
                template, configs[name], prepared, spec, FIRST_SEED + index
            )
            runs[name].append(run)
            print(
                f"seed {index}: {name}: {run['time_to_target'] or run['seconds']:.2f} s", flush=True
            )
    reference = names[1]
    summary = {name: summarized(runs[name], runs[reference]) for name in names}
    for name in names:
        speed, ratio, time = (
            summary[name][k] for k in ("samples_per_second", "speed_ratio", "time_to_target")
        )
        reached = (
            "not reached"
            if time is None
            else f"{time['median']:.2f} s ({time['range'][0]:.2f}-{time['range'][1]:.2f})"
        )
        print(
            f"{name:>22}: {speed['median']:,.0f}/s ({speed['range'][0]:,.0f}-"
            f"{speed['range'][1]:,.0f}), x{ratio['median']:.2f} the speed of {reference} "
            f"({ratio['range'][0]:.2f}-{ratio['range'][1]:.2f}); to the target {reached}, "
            f"{summary[name]['reached']} runs reached it"
        )
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"device-data-{spec.name}-{prepared.device.type}.json"
    record = {
        "study": str(args.study.relative_to(REPO))
        if args.study.is_relative_to(REPO)
        else str(args.study),
        "maths": "expert" if args.expert else "baseline",
        "seeds": args.seeds,
        "speed_ratio_against": reference,
        "arms": {name: {"config": configs[name], **summary[name]} for name in names},
        "runs": runs,
        **provenance(prepared.device),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
