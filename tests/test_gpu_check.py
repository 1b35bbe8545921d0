"""The GPU check's stages run their plumbing on the CPU (`--cpu`), the OOM stage against a real
torch.cuda.OutOfMemoryError raised by the model; without a GPU and without --cpu, it says so and
checks nothing. On a GPU, `bash scripts/gpu-check.sh` is the real thing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def gpu_check(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """The command as a user runs it, with the drawn shapes cached in `cache`, not in the user's
    cache."""
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-check.sh"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable, "AUTOTUNE_CACHE": str(cache)},
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the check runs for real")
def test_without_a_gpu_it_says_so_and_checks_nothing(tmp_path: Path) -> None:
    ran = gpu_check("--results", str(tmp_path / "results"), cache=tmp_path / "cache")
    assert ran.returncode == 0, ran.stderr
    assert "No CUDA GPU found" in ran.stdout and "nothing was checked" in ran.stdout
    assert list(tmp_path.iterdir()) == []


def test_confirm_before_the_study_is_finished_says_so_and_fails(tmp_path: Path) -> None:
    ran = gpu_check("confirm", "--cpu", "--results", str(tmp_path), cache=tmp_path / "cache")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert (
        "## confirm: FAILED" in ran.stdout
        and "The study has 0 of its 2 trials: run the study stage" in ran.stdout
    )
    assert not (tmp_path / "gpu-check-shapes-cpu.db").exists()  # nothing was run


def test_every_stage_runs_its_plumbing_on_the_cpu(tmp_path: Path) -> None:
    ran = gpu_check("--cpu", "--results", str(tmp_path), cache=tmp_path / "cache")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    stages = ("tests", "oom", "precision", "study", "confirm", "isolation", "distributed")
    for stage in stages:
        assert f"## {stage}: ok" in ran.stdout
        record = json.loads((tmp_path / f"gpu-check-{stage}-cpu.json").read_text())
        assert (
            record["ok"]
            and record["stage"] == stage
            and record["torch"] == torch.__version__
            and record["commit"]
        )

    oom = json.loads((tmp_path / "gpu-check-oom-cpu.json").read_text())
    outcomes = {
        (t["batch_size"], t["precision"]): (t["state"], t["oom"], t["oom_bound"])
        for t in oom["trials"]
    }
    assert outcomes[(64, "fp32")] == ("COMPLETE", False, False)
    assert outcomes[(128, "bf16")] == ("PRUNED", True, False)  # ran, and really ran out
    assert outcomes[(256, "fp32")] == ("PRUNED", False, True)  # known to run out: never ran
    assert len(oom["memory_after_each_run"]) == 5  # every trial that ran, the OOM included

    isolated = json.loads((tmp_path / "gpu-check-isolation-cpu.json").read_text())
    assert set(isolated["summary"]) == {
        "in-process",
        "child process",
        "warm child",
        "in-process, cuDNN's search",
        "child process, cuDNN's search",
        "warm child, cuDNN's search",
    }
    assert all(row["train"] > 0 for row in isolated["summary"].values())
    assert set(isolated["extra_wall_seconds_per_trial"]) == {"child process", "warm child"}
    assert set(isolated["search_skipped_seconds"]) == {"in-process", "warm child"}

    ranks = json.loads((tmp_path / "gpu-check-distributed-cpu.json").read_text())
    assert set(ranks["runs"]) == {"one rank", "child process"}
    assert all(r["error"] is None and r["train"] > 0 for r in ranks["runs"].values())

    precision = json.loads((tmp_path / "gpu-check-precision-cpu.json").read_text())
    assert set(precision["settings"]) == {
        "fp32",
        "fp32 channels_last",
        "bf16",
        "bf16 channels_last",
    }
    assert precision["settings"]["fp32"]["vs_fp32"] == 1.0

    study = json.loads((tmp_path / "gpu-check-study-cpu.json").read_text())
    assert study["exit_status"] == 0 and study["summary"]["counts"]["total"] == 2
    # the confirm stage's, so each stage stays short
    assert study["summary"]["confirmation"] is None
    assert study["command"][study["command"].index("--isolation") + 1] == "process"
    confirmed = json.loads((tmp_path / "gpu-check-confirm-cpu.json").read_text())
    assert (
        confirmed["summary"]["confirmation"] is not None
        and confirmed["summary"]["counts"]["total"] == 2
    )
    assert "winner: " in ran.stdout and "speedup" in ran.stdout

    tests = json.loads((tmp_path / "gpu-check-tests-cpu.json").read_text())
    # tests/test_cuda.py needs a GPU
    assert tests["exit_status"] == 0 and tests["skipped"] >= 4 and tests["passed"] == 0


def test_the_study_stages_run_the_shapes_study_with_another_objective_as_a_study_of_its_own(
    tmp_path: Path,
) -> None:
    # goodput: its table from the joint probe is what systems_only shares, and the plumbing is one
    objective = "goodput"
    ran = gpu_check(
        "study",
        "confirm",
        "--cpu",
        "--objective",
        objective,
        "--results",
        str(tmp_path),
        cache=tmp_path / "cache",
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert (
        "## study: ok" in ran.stdout and "## confirm: ok" in ran.stdout and "winner: " in ran.stdout
    )
    confirmed = json.loads((tmp_path / f"gpu-check-confirm-{objective}-cpu.json").read_text())
    assert (
        confirmed["summary"]["objective"] == objective
        and confirmed["summary"]["confirmation"] is not None
    )
    # the table the trials were timed by is the joint probe's, and is reported
    assert confirmed["summary"]["throughput"]["from_probe"] and confirmed["summary"]["probe"]
    assert (tmp_path / f"gpu-check-shapes-{objective}-cpu.db").exists()
    assert (
        not (tmp_path / "gpu-check-shapes-cpu.db").exists()
        and not (tmp_path / "gpu-check-confirm-cpu.json").exists()
    )
