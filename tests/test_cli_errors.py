"""The user-facing contract for bad input, through the real console entry point.

Every case: exit status 2, one line on stderr naming the file, no traceback, nothing on stdout,
and the study's storage untouched (not created, or byte-for-byte as it was).
Each case starts a Python process that imports torch (about 2 s), so cases are few and dense.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAD = "task: digits\ntarget: {metric: accuracy, value: 0.97}\n"
TARGET = "target: {metric: accuracy, value: 0.97}\n"
GARBAGE = b"not an sqlite database \x00\x01\x02 keep me as I am\n"


def run_autotune(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ARGS` in `folder`, importing this checkout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, f"exit {result.returncode}; stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, no traceback, exactly one non-empty stderr line containing every fragment."""
    assert_no_traceback(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), f"expected one line on stderr, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("autotune: error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad invocation: the study file (None: not written), what the error line must say."""

    id: str
    study: str | None
    fragments: tuple[str, ...]
    command: str = "run"
    files: tuple[tuple[str, str], ...] = ()  # other files beside the study (a user's task module)
    storage: bytes | None = None  # pre-existing bytes in study.db, which must survive unchanged


CASES = [
    Case("malformed yaml", HEAD + "space: {lr: [0.1, 0.2}\n", ("(yaml)", "not valid YAML"), storage=GARBAGE),
    Case("unknown top-level key", HEAD + "budjet: {trials: 3}\n", ("budjet", "did you mean 'budget'?"),
         storage=GARBAGE),
    Case("trials is text", HEAD + "budget: {trials: ten}\n", ("budget.trials: got 'ten'", "at least 1")),
    Case("unknown knob", HEAD + "space: {batchsize: [32]}\n", ("space.batchsize", "did you mean 'batch_size'?")),
    Case("inverted range", HEAD + "space: {lr: {low: 0.5, high: 0.1}}\n", ("space.lr", "0.5", "low < high")),
    Case("unknown scheduler", HEAD + "space: {scheduler: [linear]}\n", ("space.scheduler[0]: got 'linear'", "onecycle")),
    Case("bad device", HEAD + "device: gpu\n", ("device: got 'gpu'", "cuda:N")),
    Case("bad storage url", HEAD + "storage: study.db\n", ("storage: got 'study.db'", "sqlite:///")),
    Case("unknown baseline key", HEAD + "baseline: {batchsize: 64}\n", ("baseline.batchsize", "batch_size")),
    Case("confirm runs negative", HEAD + "confirm: {runs: -1}\n", ("confirm.runs: got -1", "at least 0")),
    Case("unknown task name", "task: nosuch\n" + TARGET, ("task: got 'nosuch'", "digits")),
    Case("task module missing", "task: nosuchmodule_xyz:task\n" + TARGET,
         ("task", "ModuleNotFoundError: No module named 'nosuchmodule_xyz'"), storage=GARBAGE),
    Case("task module raises ImportError", "task: badmod_xyz:task\n" + TARGET,
         ("task", "ImportError: broken dependency libfoo"),
         files=(("badmod_xyz.py", 'raise ImportError("broken dependency libfoo")\n'),), storage=GARBAGE),
    Case("fp16 only on cpu", HEAD + "device: cpu\nspace: {precision: fp16}\n", ("space.precision", "fp16", "cpu"),
         storage=GARBAGE),
    Case("missing study file", None, ("(file)", "no such file")),
    Case("report before any run", HEAD, ("storage", "no database", "autotune run"), command="report"),
    Case("report on a corrupt storage", HEAD, ("storage", "cannot open"), command="report", storage=GARBAGE),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_leaves_storage_alone(tmp_path: Path, case: Case) -> None:
    """Exit 2, one stderr line naming study.yaml, no traceback; study.db not created or unchanged."""
    if case.study is not None:
        (tmp_path / "study.yaml").write_text(case.study)
    for name, text in case.files:
        (tmp_path / name).write_text(text)
    storage = tmp_path / "study.db"
    if case.storage is not None:
        storage.write_bytes(case.storage)

    result = run_autotune(tmp_path, case.command, "study.yaml")

    assert_one_line_error(result, "study.yaml", *case.fragments)
    if case.storage is None:
        assert not storage.exists(), "a failed command created the storage"
    else:
        assert storage.read_bytes() == case.storage, "a failed command changed the storage"


# Argument errors are argparse's: a usage block, then one error line naming the option.
ARGUMENT_CASES = [
    ("trials zero", ("--trials", "0"), "argument --trials", "'0'"),
    ("timeout negative", ("--timeout", "-1"), "argument --timeout", "'-1'"),
]


@pytest.mark.parametrize(("args", "option", "value"), [case[1:] for case in ARGUMENT_CASES],
                         ids=[case[0] for case in ARGUMENT_CASES])
def test_bad_option_is_rejected_before_anything_runs(tmp_path: Path, args: tuple[str, ...], option: str,
                                                     value: str) -> None:
    """Exit 2, no traceback, the last line names the option and the value; no storage created."""
    (tmp_path / "study.yaml").write_text(HEAD)

    result = run_autotune(tmp_path, "run", "study.yaml", *args)

    assert_no_traceback(result)
    assert result.stderr.startswith("usage: autotune run"), result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("autotune run: error: ") and option in last and value in last, last
    assert not (tmp_path / "study.db").exists()
