"""Stages about memory and processes: a real out-of-memory study, and what a child process per
trial costs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autotune.report import results
from autotune.runners import isolation, warm
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.spec import study_file
from autotune.storage import opening
from autotune.study import one_trial, preparation
from autotune.study.begin import begin
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import load_task
from benchmarks.gpu_check.common import Setting, interleaved, median, memory_in_use, mib

# Micro-batches from far inside the card to far past it: the shapes ResNet at width 256 holds tens
# of MiB of activations per image, so 32,768 images need terabytes on any GPU made so far.
OOM_GPU = {"batch_size": [256, 1024, 8192, 32768], "width": 256}
# On CPU the model raises a real torch.cuda.OutOfMemoryError from 128 images up (tests/tasks.py).
OOM_CPU = {"batch_size": [16, 64, 128, 256], "task": "tests.tasks:cuda_oom"}
# Every other knob pinned: a sampler left free draws torch.compile for some trials, and compiling a
# width-256 ResNet costs minutes a trial (seen on an H100) and tells nothing about memory.
PINNED = {
    "lr": 0.05,
    "scheduler": "constant",
    "accumulation_steps": 1,
    "channels_last": False,
    "compile": False,
    "cudnn_benchmark": False,
}
# a DataLoader's: the training set kept on the device would add its own bytes to the batch's
LOADER_GPU = {"data_on_device": False, "num_workers": 4, "prefetch_factor": 2, "pin_memory": True}
LOADER_CPU = {"data_on_device": False, "num_workers": 0, "pin_memory": False}
# NVML counts whole pages and the driver's own bookkeeping moves a little
LEAK_TOLERANCE = 64 * 2**20


def oom(setting: Setting) -> tuple[dict[str, Any], list[str], bool]:
    """A study whose larger micro-batches cannot fit: they end PRUNED as out of memory, the study
    goes on, configurations known to run out are skipped without running, and the GPU's memory
    is back where it started after every trial."""
    sizes = OOM_GPU if setting.cuda else OOM_CPU
    # Smallest first, the narrower precision before the wider: each OOM then bounds what follows.
    grid = [
        {"batch_size": b, "precision": p} for b in sizes["batch_size"] for p in ("bf16", "fp32")
    ]
    with tempfile.TemporaryDirectory() as folder:
        raw = {
            "name": "gpu-check-oom",
            "task": sizes.get("task", setting.task),
            "target": {"metric": "accuracy", "value": 0.999},
            "device": setting.device.type,
            "probe": "none",
            "prune": "none",
            "first_trial": "sampled",  # its trials are the grid below, queued in its order
            "isolation": "process" if setting.cuda else "none",
            "space": {
                "batch_size": sizes["batch_size"],
                "precision": ["bf16", "fp32"],
                **PINNED,
                **(LOADER_GPU if setting.cuda else LOADER_CPU),
                **({"params": {"width": sizes["width"]}} if "width" in sizes else {}),
            },
            "budget": {
                "trials": len(grid),
                "max_epochs": 0.5,
                "max_seconds": 10,
                "eval_every": 0.5,
            },
            "confirm": {"top": 0, "runs": 0},
        }
        spec = study_file.from_mapping(raw, path=Path(folder) / "oom.yaml")
        prepared = preparation.prepare(spec)
        start = memory_in_use(setting.device)
        after: list[dict[str, Any]] = []
        prepared = dataclasses.replace(
            prepared, run_trial=_watched(prepared.run_trial, setting, after)
        )
        study = opening.open_study(spec, create=True)
        begin(spec, prepared, study)
        for params in grid:
            study.enqueue_trial(params)
        # The study's own trial step, over the grid in this order (a sampler would pick its own).
        for number, params in enumerate(
            grid
        ):  # enqueued in this order, so trial `number` runs `params`
            policy = one_trial.Policy(
                space=prepared.space,
                run_trial=prepared.run_trial,
                device=prepared.device,
                limits=preparation.limits_for(spec),
                seed=spec.seed,
                metric_name="accuracy",
                budget=len(grid),
            )
            started = time.perf_counter()
            with contextlib.redirect_stderr(io.StringIO()):
                one_trial.run_one(study, policy, asked=[], known=study.get_trials(deepcopy=False))
            last = study.get_trials(deepcopy=False)[number]
            # A line a trial, so that a stage of minutes shows where it is.
            reason = last.user_attrs.get("reason")
            print(
                f"  oom: batch {params['batch_size']} {params['precision']}: "
                f"{last.state.name.lower()}"
                f"{f' ({reason})' if reason else ''}, {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )
        records = results.trial_records(study.get_trials(deepcopy=False))
    trials = [
        {
            "batch_size": r.batch_size,
            "precision": r.precision,
            "state": r.state,
            "oom": r.oom,
            "oom_bound": r.oom_bound,
            "reason": r.reason,
        }
        for r in records.itertuples()
    ]
    leaks = [a["nvml_used"] - start["nvml_used"] for a in after if a["nvml_used"] is not None]
    figures = {
        "start": start,
        "trials": trials,
        "memory_after_each_run": after,
        "largest_growth_bytes": max(leaks, default=None),
    }
    counts = {kind: sum(t[kind] for t in trials) for kind in ("oom", "oom_bound")}
    complete_ = sum(t["state"] == "COMPLETE" for t in trials)
    ok = (
        len(trials) == len(grid)
        and counts["oom"] >= 1
        and counts["oom_bound"] >= 1
        and complete_ >= 1
        and all(leak <= LEAK_TOLERANCE for leak in leaks)
    )
    lines = [
        f"{len(trials)} trials: {complete_} complete, {counts['oom']} out of memory (pruned), "
        f"{counts['oom_bound']} skipped as known to run out",
        "| batch | precision | outcome |",
        "|---|---|---|",
    ]
    lines += [f"| {t['batch_size']} | {t['precision']} | {_outcome(t)} |" for t in trials]
    lines.append(
        f"GPU memory in use before the study {mib(start['nvml_used'])}; "
        f"largest growth after a trial {mib(figures['largest_growth_bytes'])}"
        if leaks
        else "GPU memory: not measured (no GPU)"
    )
    return figures, lines, ok


def _outcome(trial: dict[str, Any]) -> str:
    if trial["oom_bound"]:
        return "skipped: known to run out"
    return "out of memory" if trial["oom"] else trial["state"].lower()


def _watched(
    run_trial: isolation.RunTrial, setting: Setting, after: list[dict[str, Any]]
) -> isolation.RunTrial:
    """`run_trial` noting the GPU's memory in use once each run is over, OOM or not."""

    def run(config: TrialConfig, **kwargs: Any) -> Any:
        try:
            return run_trial(config, **kwargs)
        finally:
            after.append(
                {
                    "batch_size": config.batch_size,
                    "precision": config.precision,
                    **memory_in_use(setting.device),
                }
            )

    return run


def isolation_overhead(
    setting: Setting, *, rounds: int = 5
) -> tuple[dict[str, Any], list[str], bool]:
    """Wall time per trial in this process and in a child process of its own, fresh or kept warm,
    interleaved; and the same trial with cuDNN's search in each: this process keeps the
    algorithms its first trial searched for, so its later trials skip what a user's fresh run
    pays, and a warm child, replaced before each trial with the search after the first, should
    not."""
    plain = TrialConfig.from_mapping(complete(DEFAULT_BASELINE))
    searched = dataclasses.replace(plain, cudnn_benchmark=True)
    limits = Limits(
        target=2.0, max_epochs=0.1 if setting.cuda else 0.05, max_seconds=120, eval_every=1.0
    )
    study_path = setting.results / "gpu-check.yaml"

    def kept() -> isolation.RunTrial:
        child = warm.WarmChild(
            setting.task, study_path=study_path, hang_after=300, measure_hang_after=300
        )
        return child.run_trial

    fresh = isolation.in_child(setting.task, study_path=study_path, hang_after=300)
    runners = {
        "in-process": (isolation.in_process(load_task(setting.task)), plain),
        "child process": (fresh, plain),
        "warm child": (kept(), plain),
        "in-process, cuDNN's search": (isolation.in_process(load_task(setting.task)), searched),
        "child process, cuDNN's search": (fresh, searched),
        "warm child, cuDNN's search": (kept(), searched),
    }

    def timed(run_trial: isolation.RunTrial, config: TrialConfig) -> Any:
        def run(index: int) -> dict[str, float]:
            started = time.perf_counter()
            result = run_trial(config, limits=limits, device=setting.device, seed=index)
            wall = time.perf_counter() - started
            return {
                "wall": wall,
                "train": result.train_seconds,
                "outside": wall - result.train_seconds,
            }

        return run

    samples = interleaved(
        {name: timed(*runner) for name, runner in runners.items()},
        rounds=rounds if setting.cuda else 1,
        warm_up=setting.cuda,  # on the CPU the stage runs its plumbing, which needs no warm-up
    )
    summary = {
        name: {key: median([s[key] for s in runs]) for key in ("wall", "train", "outside")}
        for name, runs in samples.items()
    }
    extra = {
        name: row["wall"] - summary["in-process"]["wall"]
        for name, row in summary.items()
        if name in ("child process", "warm child")
    }
    # on the training clock: the search a fresh child's trial pays, beside one that keeps it
    search_skipped = {
        where: summary["child process, cuDNN's search"]["train"]
        - summary[f"{where}, cuDNN's search"]["train"]
        for where in ("in-process", "warm child")
    }
    lines = ["| where | wall s | training s | outside training s |", "|---|---|---|---|"]
    lines += [
        f"| {name} | {row['wall']:.3f} | {row['train']:.3f} | {row['outside']:.3f} |"
        for name, row in summary.items()
    ]
    lines += [
        f"A {name} adds {added:.3f} s a trial (median of {len(samples['in-process'])})."
        for name, added in extra.items()
    ]
    lines.append(
        f"With cuDNN's search, an in-process trial trains {search_skipped['in-process']:.3f} s "
        "less than a fresh child's (medians): the search its first trial made, which the others "
        f"reuse; a warm child's {search_skipped['warm child']:.3f} s less (replaced before each "
        "such trial, it should pay the search as a fresh child does)."
    )
    return (
        {
            "summary": summary,
            "extra_wall_seconds_per_trial": extra,
            "search_skipped_seconds": search_skipped,
            "samples": samples,
        },
        lines,
        True,
    )


def distributed(setting: Setting) -> tuple[dict[str, Any], list[str], bool]:
    """A trial as the ranks of a trial on several devices run it (runners/distributed.py), with one
    rank: its process group joined (NCCL on a GPU, gloo on the CPU), the baseline trained for a
    tenth of an epoch, and the GPU's memory back where it started once it is over. Then the same
    trial in a child process of its own, for the time the process group adds."""
    from autotune.runners import distributed as ranks

    config = TrialConfig.from_mapping(complete(DEFAULT_BASELINE))
    limits = Limits(
        target=2.0, max_epochs=0.1 if setting.cuda else 0.05, max_seconds=120, eval_every=1.0
    )
    study_path = setting.results / "gpu-check.yaml"
    start = memory_in_use(setting.device)
    runs: dict[str, Any] = {}
    for name, run_trial in (
        (
            "one rank",
            ranks.on_devices(setting.task, study_path=study_path, hang_after=300, devices=1),
        ),
        ("child process", isolation.in_child(setting.task, study_path=study_path, hang_after=300)),
    ):
        started = time.perf_counter()
        try:
            result = run_trial(config, limits=limits, device=setting.device, seed=0)
            runs[name] = {
                "wall": time.perf_counter() - started,
                "train": result.train_seconds,
                "samples_per_second": result.samples_per_second,
                "error": None,
            }
        except isolation.TrialFailure as failure:
            runs[name] = {"wall": time.perf_counter() - started, "error": failure.reason}
        runs[name]["memory_after"] = memory_in_use(setting.device)
    growth = [
        r["memory_after"]["nvml_used"] - start["nvml_used"]
        for r in runs.values()
        if r["memory_after"]["nvml_used"] is not None and start["nvml_used"] is not None
    ]
    ok = all(r["error"] is None for r in runs.values()) and all(g <= LEAK_TOLERANCE for g in growth)
    backend = "NCCL" if setting.cuda else "gloo"
    lines = [f"| {backend} | wall s | training s | samples/s | error |", "|---|---|---|---|---|"]
    lines += [
        f"| {name} | {r['wall']:.2f} | {r.get('train') or 0:.2f} | "
        f"{r.get('samples_per_second') or 0:,.0f} | {r['error'] or ''} |"
        for name, r in runs.items()
    ]
    lines.append(
        f"GPU memory in use before {mib(start['nvml_used'])}; largest growth after a run "
        f"{mib(max(growth))}"
        if growth
        else "GPU memory: not measured (no GPU)"
    )
    return (
        {"start": start, "runs": runs, "largest_growth_bytes": max(growth, default=None)},
        lines,
        ok,
    )
