"""The README's promises: its example task runs as written, and CI runs its test command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.space import KNOBS

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def block_after(label: str) -> str:
    """The first fenced code block after the line that names `label`."""
    match = re.search(rf"`{re.escape(label)}`[^\n]*\n+```\w*\n(.*?)```", README, re.S)
    assert match, f"no code block after {label} in README.md"
    return match.group(1)


def test_the_custom_task_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_task.py").write_text(block_after("my_task.py"))
    (tmp_path / "my_study.yaml").write_text(block_after("my_study.yaml"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "my_study.yaml"]) == 0
    assert "Winner: trial" in capsys.readouterr().out
    assert main(["report", "my_study.yaml", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["counts"]["complete"] == 6 and (tmp_path / "my_study.db").is_file()
    assert set(summary["best"]["params"]) == set(KNOBS) and summary["best"]["metric"] >= 0.95


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(commands) >= 2 and "autotune run studies/digits.yaml" in commands[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert commands[1].strip() in ci.splitlines()
