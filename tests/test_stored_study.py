"""A study stored by an earlier autotune reads the same today: its report and flat exports.

tests/data/stored_study holds a small digits study (SQLite, with a confirmation) as autotune
stored it, and what `autotune report` and `autotune export` said of it then.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autotune.cli import main

STORED = Path(__file__).parent / "data" / "stored_study"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """A copy of the stored study: reading it must not depend on writing next to the original."""
    for path in STORED.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "small.yaml"


def test_report_json_reads_the_same(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((STORED / "report.json").read_text())


def test_report_text_reads_the_same(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study)]) == 0
    assert capsys.readouterr().out == (STORED / "report.txt").read_text()


@pytest.mark.parametrize("fmt", ["json", "yaml", "args", "lightning", "hf"])
def test_export_reads_the_same(study: Path, fmt: str) -> None:
    out = study.parent / f"again.{fmt}"
    assert main(["export", str(study), "--format", fmt, "-o", str(out)]) == 0
    assert out.read_text() == (STORED / f"export.{fmt}").read_text()
