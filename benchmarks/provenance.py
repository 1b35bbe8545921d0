"""What produced a benchmark's numbers: machine, versions and commit, kept beside the numbers."""

from __future__ import annotations

import hashlib
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
        "code": code_identity(),
    }


# What decides a measurement: the package, the benchmarks' code and the study files. Not the
# results, the docs or the tests, whose commits between two sittings change no figure.
CODE = ("autotune", "benchmarks", "studies", "pyproject.toml")
CODE_SUFFIXES = (".py", ".yaml", ".toml")


def code_identity(root: Path = REPO) -> str:
    """A digest of the code's content as it is on disk, committed or not: equal on two machines
    that run the same code, whatever commit (or none: a copy without .git) each one names."""
    digest = hashlib.sha256()
    for top in CODE:
        where = root / top
        files = sorted(where.rglob("*")) if where.is_dir() else [where]
        for path in files:
            relative = path.relative_to(root)
            if relative.parts[:2] == ("benchmarks", "results") or path.suffix not in CODE_SUFFIXES:
                continue
            if "__pycache__" in relative.parts or not path.is_file():
                continue
            digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]
