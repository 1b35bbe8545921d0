"""What produced a benchmark's numbers: machine, versions and commit, kept beside the numbers."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def provenance(device: Any) -> dict[str, Any]:
    import optuna
    import torch

    from autotune.train.measure import device_name

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    # results files change as benchmarks write them: only a change to the code marks a commit dirty
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout.strip()
    return {
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "device": device_name(device),
        "torch": torch.__version__,
        "optuna": optuna.__version__,
        "python": platform.python_version(),
        "commit": commit + ("+changes" if dirty else ""),
    }
