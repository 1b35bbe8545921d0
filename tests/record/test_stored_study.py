"""A study stored by an earlier autotune reads the same today: its report and flat exports.

tests/data/stored_study holds a small digits study (SQLite, with a confirmation) as autotune
stored it, and what `autotune report` and `autotune export` said of it then.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.record import derived, schema

STORED = Path(__file__).parents[1] / "data" / "stored_study"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """A copy of the stored study: reading it must not depend on writing next to the original."""
    for path in STORED.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "small.yaml"


def test_report_json_reads_the_same(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As it read then, and what reports came to say since: where its time went (the trials'
    from their stored times, the confirmation's not recorded then) and that none of its trials
    was pruned for an effective batch larger than the training set."""
    assert main(["report", str(study), "--json"]) == 0
    now = json.loads(capsys.readouterr().out)
    spent = now.pop("time_spent")
    assert now["counts"].pop("too_large") == 0
    assert now == json.loads((STORED / "report.json").read_text())
    assert spent["trial_count"] == now["counts"]["total"] and spent["confirmation"] is None


def test_report_text_reads_the_same(study: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(study)]) == 0
    lines = capsys.readouterr().out.splitlines(keepends=True)
    spent = [line for line in lines if line.startswith("Time spent: ")]
    assert len(spent) == 1 and " trials " in spent[0] and "confirmation" not in spent[0]
    lines.remove(spent[0])
    assert "".join(lines) == (STORED / "report.txt").read_text()


@pytest.mark.parametrize("fmt", ["json", "yaml", "args", "lightning", "hf"])
def test_export_reads_the_same(study: Path, fmt: str) -> None:
    out = study.parent / f"again.{fmt}"
    assert main(["export", str(study), "--format", fmt, "-o", str(out)]) == 0
    assert out.read_text() == (STORED / f"export.{fmt}").read_text()


def test_running_it_again_trains_nothing_and_keeps_its_version(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its trials stay as stored (version 0, no `schema_version`); only the optimizer's reference
    is recorded again under its module's current name."""
    assert main(["report", str(study), "--json"]) == 0
    before = json.loads(capsys.readouterr().out)["time_spent"]
    assert main(["run", str(study)]) == 0
    stored = optuna.load_study(study_name="small", storage=f"sqlite:///{study.parent / 'small.db'}")
    assert len(stored.trials) == 6 and schema.VERSION not in stored.user_attrs
    assert schema.version(stored.user_attrs) == 0
    capsys.readouterr()
    assert main(["report", str(study), "--json"]) == 0
    expected = json.loads((STORED / "report.json").read_text())
    now = json.loads(capsys.readouterr().out)
    assert now.pop("time_spent") == before  # nothing ran
    assert now["counts"].pop("too_large") == 0  # a count reports came to give since
    assert now == {**expected, "optimizer": "autotune.train.tasks:sgd"}


def test_legacy_references_read_as_today() -> None:
    assert derived.current_reference("autotune.tasks:sgd") == "autotune.train.tasks:sgd"
    assert derived.current_reference("my_task:make_optimizer") == "my_task:make_optimizer"
    assert derived.current_reference(None) is None
