"""benchmarks/trial_rates.py at its CPU size: every setting trained by the trial loop both ways and
its step measured alone, written as it goes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_setting_is_trained_both_ways_and_its_step_measured_alone(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "benchmarks/trial_rates.py", "--cpu", "--epochs", "0.5"]
        + ["--results", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((tmp_path / "trial_rates-digits-cpu.json").read_text())
    names = ("chosen", "chosen, checkpointing", "expert")
    assert set(record["runs"]) == {
        f"{name}, evaluated {when}"
        for name in names
        for when in ("every quarter epoch", "at the end only")
    }
    for label, run in record["runs"].items():
        # half an epoch (in whole steps): split in two by quarter-epoch evaluations, or one piece
        assert len(run["segments"]) == (2 if "quarter" in label else 1), label
        assert run["epochs"] > 0.45 and all(rate > 0 for rate in run["segments"])
    assert set(record["step_alone"]) == set(names)
    assert all(r["samples_per_second"] > 0 for r in record["step_alone"].values())
    assert record["provenance"]["device"]
