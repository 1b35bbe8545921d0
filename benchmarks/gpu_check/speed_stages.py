"""Stages about speed: the precisions, memory formats and compilation side by side, and the shapes
study end to end against its baseline."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from autotune.runners import isolation
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.spec.study_file import load
from autotune.study.budget import trials_to_train
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import load_task
from benchmarks.gpu_check.common import REPO, Setting, interleaved, median

# A loader that keeps up (workers, pinned memory, cuDNN's search) and a batch that fills the GPU,
# so the figures show the arithmetic: fp32, fp16 + GradScaler, bf16, with and without
# channels-last and torch.compile.
GPU_LOADER = {
    "batch_size": 256,
    "num_workers": 8,
    "prefetch_factor": 4,
    "pin_memory": True,
    "cudnn_benchmark": True,
}


def precision(setting: Setting, *, rounds: int = 3) -> tuple[dict[str, Any], list[str], bool]:
    """Training throughput (samples/s after warm-up) of each precision x memory format x compile,
    interleaved in rounds; compile's one-off cost shows in the seconds of each short run."""
    if setting.cuda:
        grid = itertools.product(("fp32", "fp16", "bf16"), (False, True), (False, True))
        base, limits = (
            {**DEFAULT_BASELINE, **GPU_LOADER},
            Limits(target=2.0, max_epochs=0.5, max_seconds=120, eval_every=1.0),
        )
    else:  # fp16 needs CUDA, and compiling costs tens of seconds a run on a small CPU
        grid = itertools.product(("fp32", "bf16"), (False, True), (False,))
        base, limits, rounds = (
            {**DEFAULT_BASELINE, "batch_size": 64},
            Limits(target=2.0, max_epochs=0.1, max_seconds=60, eval_every=1.0),
            1,
        )
    run_trial = isolation.in_process(load_task(setting.task))
    configs = {
        f"{p}{' channels_last' if cl else ''}{' compile' if c else ''}": TrialConfig.from_mapping(
            complete({**base, "precision": p, "channels_last": cl, "compile": c})
        )
        for p, cl, c in grid
    }

    def runner(config: TrialConfig) -> Any:
        def run(index: int) -> dict[str, Any]:
            try:
                result = run_trial(config, limits=limits, device=setting.device, seed=index)
            except isolation.TrialFailure as failure:
                return {"failed": failure.reason}
            return {
                "samples_per_second": result.samples_per_second,
                "train_seconds": result.train_seconds,
            }

        return run

    samples = interleaved(
        {name: runner(config) for name, config in configs.items()}, rounds=rounds, warm_up=False
    )
    reference = median([s.get("samples_per_second") for s in samples["fp32"]])
    rows = {}
    for name, runs in samples.items():
        speed = median([s.get("samples_per_second") for s in runs])
        rows[name] = {
            "samples_per_second": speed,
            "train_seconds": median([s.get("train_seconds") for s in runs]),
            "vs_fp32": None if speed is None or not reference else speed / reference,
            "failures": [s["failed"] for s in runs if "failed" in s],
        }
    lines = [
        "| setting | samples/s | x fp32 "
        f"| seconds a run ({limits.max_epochs:g} epoch, compile included) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {_num(r['samples_per_second'], '.0f')} | {_num(r['vs_fp32'], '.2f')} "
        f"| {_num(r['train_seconds'], '.2f')} |"
        + (f" failed: {r['failures'][0]}" if r["failures"] else "")
        for name, r in rows.items()
    ]
    ok = all(not r["failures"] for r in rows.values())
    return (
        {"rounds": rounds, "limits": limits.__dict__, "settings": rows, "samples": samples},
        lines,
        ok,
    )


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def study(
    setting: Setting, *, timeout: float = 360, objective: str | None = None
) -> tuple[dict[str, Any], list[str], bool]:
    """The shapes study's trials: `autotune run` with each trial in a child process, for at most
    `timeout` seconds, its probe included (run the stage again to go on: the study resumes). The
    confirmation on fresh seeds is the `confirm` stage's, so that each stage stays under 8 minutes.
    `objective` runs the same study with another objective (goodput, systems_only), apart."""
    study_file, storage, budget = _study_files(setting, objective)
    searching = storage.with_name(f"{storage.stem}-search.yaml")
    raw = yaml.safe_load(study_file.read_text())
    # The same study (name, definition and storage) with its confirmation left for later.
    searching.write_text(
        yaml.safe_dump(
            {**raw, "name": raw.get("name", study_file.stem), "confirm": {"top": 0, "runs": 0}}
        )
    )
    figures, summary = _run(setting, searching, storage, "--timeout", f"{timeout:g}")
    if summary is None:
        return (
            figures,
            [
                f"`autotune run` failed (exit status {figures['exit_status']}): "
                f"{figures['last_line']}"
            ],
            False,
        )
    counts = summary["counts"]
    finished = _finished(counts)
    lines = [
        f"{finished} of {budget} trials ({counts['complete']} complete, {counts['pruned']} pruned, "
        f"{counts['failed']} failed) after {figures['wall_seconds']:.0f} s of this stage",
        "The study is finished: run the confirm stage."
        if finished >= budget
        else "The study is not finished: run this stage again to go on.",
    ]
    return figures, lines, counts["failed"] < counts["total"]


def confirm(
    setting: Setting, *, objective: str | None = None
) -> tuple[dict[str, Any], list[str], bool]:
    """The finished shapes study's winner against the baseline on fresh seeds, side by side, with
    the GPU's utilisation, input wait and peak memory: `autotune run` once the budget is spent."""
    study_file, storage, budget = _study_files(setting, objective)
    done = _trials_stored(setting, study_file, storage)
    # `autotune run` would first run the missing trials, past this stage's 8 minutes
    if done < budget:
        return (
            {"trials_stored": done, "budget": budget},
            [
                f"The study has {done} of its {budget} trials: "
                "run the study stage until it is finished, then this one."
            ],
            False,
        )
    figures, summary = _run(setting, study_file, storage, "--trials", str(budget))
    if summary is None:
        return (
            figures,
            [
                f"`autotune run` failed (exit status {figures['exit_status']}): "
                f"{figures['last_line']}"
            ],
            False,
        )
    best, baseline = summary.get("best") or {}, summary.get("baseline") or {}
    telemetry = best.get("telemetry") or {}
    gpu = telemetry.get("gpu") or {}
    lines = [
        f"winner: {best.get('label', 'none')} in {_num(best.get('time_to_target'), '.2f')} s "
        f"(median of {best.get('runs')}, "
        f"range {_num(best.get('min'), '.2f')}-{_num(best.get('max'), '.2f')} s); "
        f"baseline {_num(baseline.get('time_to_target'), '.2f')} s: "
        f"speedup {_num(summary.get('speedup'), '.2f')}x",
        f"winner's hardware ({telemetry.get('source')}): "
        f"{_num(telemetry.get('samples_per_second'), '.0f')} samples/s, "
        f"input wait {_num(telemetry.get('input_wait'), '.0%')}, "
        f"peak memory {_num(telemetry.get('peak_memory_mb'), '.0f')} MiB, "
        f"GPU busy {_num(gpu.get('util_mean'), '.0f')}% on average (NVML)",
    ]
    return {**figures, "speedup": summary.get("speedup")}, lines, best != {}


def _study_files(setting: Setting, objective: str | None = None) -> tuple[Path, Path, int]:
    """The study file, its storage and its trial budget: shapes.yaml on a GPU, a tiny one on CPU;
    with `objective`, a copy of it with that objective and `probe: joint` (whose figures are the
    table goodput and systems_only trials are timed by), under its own name and storage."""
    setting.results.mkdir(parents=True, exist_ok=True)
    if setting.cuda:
        study_file = REPO / "studies" / "shapes.yaml"
    else:
        # the same commands on a task that trains in seconds on a CPU: the plumbing, not the figures
        study_file = setting.results / "gpu-check-shapes-cpu.yaml"
        study_file.write_text(SMALL_STUDY)
    raw = yaml.safe_load(study_file.read_text())
    stem = "gpu-check-shapes"
    if objective is not None:
        stem = f"gpu-check-shapes-{objective}"
        variant = setting.results / f"{stem}-{setting.device.type}.yaml"
        variant.write_text(
            yaml.safe_dump(
                {
                    **raw,
                    "name": f"{raw.get('name', study_file.stem)}-{objective}",
                    "objective": objective,
                    "probe": "joint",
                }
            )
        )
        study_file = variant
    return (
        study_file,
        setting.results / f"{stem}-{setting.device.type}.db",
        trials_to_train(load(study_file)),
    )


def _trials_stored(setting: Setting, study_file: Path, storage: Path) -> int:
    """How many of its trials the study has finished, from `autotune report --json`; 0 before it
    began."""
    report = subprocess.run(
        [
            setting.python,
            "-m",
            "autotune.cli",
            "report",
            str(study_file),
            "--json",
            "--storage",
            f"sqlite:///{storage}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return _finished(json.loads(report.stdout)["counts"]) if report.returncode == 0 else 0


def _finished(counts: dict[str, int]) -> int:
    """Trials that count against the budget: an interrupted one is retried, so it does not."""
    return counts["complete"] + counts["pruned"] + counts["failed"]


def _run(
    setting: Setting, study_file: Path, storage: Path, *options: str
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`autotune run` and then `autotune report --json` on the study, as a user types them."""
    where = ["--storage", f"sqlite:///{storage}"]
    command = [
        setting.python,
        "-m",
        "autotune.cli",
        "run",
        str(study_file),
        *where,
        "--isolation",
        "process",
        *options,
    ]
    started = time.perf_counter()
    # Its progress lines (stderr is a pipe: one line a phase and a trial) pass through as they
    # come, so that a stage of minutes shows where it is; stdout's report is read from the storage.
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO
    ) as child:
        for line in child.stderr:
            lines.append(line)
            print(f"  {line.rstrip()}", file=sys.stderr, flush=True)
    ran = subprocess.CompletedProcess(command, child.returncode, "", "".join(lines))
    wall = time.perf_counter() - started
    report = subprocess.run(
        [setting.python, "-m", "autotune.cli", "report", str(study_file), "--json", *where],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    summary = json.loads(report.stdout) if ran.returncode == 0 and report.returncode == 0 else None
    last = (ran.stderr.strip().splitlines() or [""])[-1]
    return {
        "command": command,
        "exit_status": ran.returncode,
        "wall_seconds": wall,
        "last_line": last,
        "stderr_tail": ran.stderr[-2000:],
        "summary": summary,
    }, summary


SMALL_STUDY = """\
name: gpu-check-shapes
task: tests.tasks:blobs
target: {metric: accuracy, value: 0.9}
space: {preset: default, batch_size: [32, 64], num_workers: [0], lr: {low: 0.05, high: 0.2}}
probe: none
budget: {trials: 2, max_epochs: 4, max_seconds: 20, eval_every: 0.5}
confirm: {top: 1, runs: 1}
"""
