"""Installing without network: the folder scripts/offline-wheels.sh fills installs autotune, with
no index, into an environment that already has torch, and the installed autotune runs a study
from a folder outside the checkout, finding its presets in the package.

The new environment gets this environment's torch (and what torch requires) through a .pth
file, as a GPU machine has its own torch, instead of a second install of torch. The wheels are
downloaded for real: this test needs PyPI, and takes about a minute on 2 cores.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
STUDY = """\
task: digits
target: {metric: accuracy, value: 0.9}
space: {preset: default}
budget: {trials: 2, max_epochs: 2, max_seconds: 10}
confirm: {top: 1, runs: 1}
probe: none
"""
# Whatever reaches for the network through pip or requests fails at once.
NOWHERE = "http://127.0.0.1:9"
OFFLINE = {
    "PIP_CONFIG_FILE": os.devnull,
    "PIP_NO_INDEX": "1",
    "PIP_RETRIES": "0",
    "PIP_TIMEOUT": "5",
    **{
        key: NOWHERE
        for key in (
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        )
    },
}

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() != "x86_64",
    reason="the script's default wheel tags are x86-64 Linux's (manylinux)",
)


def offline_env() -> dict[str, str]:
    """This process's environment without pip's settings, index or the checkout on the path."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_")
        and k not in ("PYTHONPATH", "VIRTUAL_ENV", "NO_PROXY", "no_proxy")
    }
    return {**keep, **OFFLINE}


def lend(names: list[str], site: Path) -> None:
    """Symlink these installed distributions, and what they require, into `site`."""
    todo, seen = list(names), set()
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        for top in {file.parts[0] for file in dist.files or []} - {"..", "__pycache__"}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)))
        requires = map(Requirement, dist.requires or [])
        todo += [
            req.name for req in requires if req.marker is None or req.marker.evaluate({"extra": ""})
        ]


def run(
    args: list[str | Path], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (
        f"{args} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    )
    return result


def test_the_wheel_folder_installs_and_runs_a_study_without_network(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    out = run(
        ["bash", REPO / "scripts" / "offline-wheels.sh", wheels, "--python-version", PYTHON],
        tmp_path,
        {**os.environ, "PYTHON": sys.executable},
    ).stdout
    assert f"python -m pip install --no-index --find-links {wheels} autotune" in out
    names = {path.name.split("-")[0].lower() for path in wheels.glob("*.whl")}
    assert {"autotune", "optuna", "psycopg_binary"} <= names
    assert not [
        n
        for n in names
        if n in ("torch", "triton") or n.startswith(("nvidia", "cuda")) and n != "nvidia_ml_py"
    ]

    # A GPU machine's environment: its own torch, no autotune, and pip (which brings no index).
    env_dir, lent = tmp_path / "env", tmp_path / "lent"
    venv.create(env_dir, with_pip=False, symlinks=True)
    lent.mkdir()
    lend(["torch", "pip"], lent)
    site = env_dir / "lib" / f"python{PYTHON}" / "site-packages"
    (site / "lent.pth").write_text(f"{lent}\n")
    python = env_dir / "bin" / "python"

    # The reference's line; --no-compile spares 20 s of byte-compiling that says nothing about the
    # folder.
    install = [
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        wheels,
        "autotune",
        "--no-compile",
    ]
    out = run(install, tmp_path, offline_env()).stdout
    assert f"Looking in links: {wheels}" in out and "Looking in indexes" not in out, out
    assert "Downloading" not in out and "Requirement already satisfied: torch" in out, out
    assert not (site / "torch").exists()  # the machine's torch was kept, not installed again
    assert (site / "autotune" / "search" / "presets" / "default.yaml").is_file()

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = run(
        [python, "-c", "import autotune; print(autotune.__file__)"], work, offline_env()
    ).stdout
    # the installed autotune, not the checkout's
    assert Path(where.strip()).is_relative_to(site), where

    (work / "study.yaml").write_text(STUDY)
    autotune = env_dir / "bin" / "autotune"
    # A preset it could not find would stop it with status 2; it ends with the report.
    assert (
        "Study study: 2 trials" in run([autotune, "run", "study.yaml"], work, offline_env()).stdout
    )
    counts = json.loads(
        run([autotune, "report", "study.yaml", "--json"], work, offline_env()).stdout
    )["counts"]
    assert counts["total"] == 2 and counts["complete"] + counts["pruned"] == 2, counts
