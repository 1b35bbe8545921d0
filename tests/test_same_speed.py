"""benchmarks/same_speed.py: the same trial trained by this checkout and by another revision, in
a process of each tree's own, alternating; at the smallest size."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_both_trees_train_the_same_trial_and_the_ratio_is_theirs(tmp_path: Path) -> None:
    ran = subprocess.run(
        [
            sys.executable,
            "benchmarks/same_speed.py",
            "--base",
            "HEAD",
            "--task",
            "tests.tasks:blobs",
            "--rounds",
            "2",
            "--epochs",
            "0.5",
            "--results",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    record = json.loads((tmp_path / "same_speed-tests.tasks.blobs-cpu.json").read_text())
    speeds = {
        name: [r["samples_per_second"] for r in runs] for name, runs in record["runs"].items()
    }
    assert set(speeds) == {"base", "this checkout"} and all(len(s) == 2 for s in speeds.values())
    medians = {name: statistics.median(s) for name, s in speeds.items()}
    assert record["ratio"] == pytest.approx(medians["this checkout"] / medians["base"])
    assert "this checkout / base: " in ran.stdout
