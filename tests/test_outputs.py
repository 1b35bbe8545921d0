"""What `report --csv/--html` and `export -o` may write: never a study's own file, by any name or
link, not even with --force; a file autotune did not write only with --force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli import main
from tests.study.test_study import load, run_cli, write_study

OUTPUTS = (("report", "--csv"), ("report", "--html"), ("export", "-o"))


def command(path: Path, kind: str, option: str, target: Path, *more: str) -> list[str]:
    fmt = ["--format", "yaml"] if kind == "export" else []
    return [kind, str(path), *fmt, option, str(target), *more]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished study, run once for the module; each test works on a copy."""
    folder = tmp_path_factory.mktemp("stored")
    path = write_study(folder, trials=2, confirm={"top": 0})
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(Path(__file__).resolve().parent.parent)  # so that `tests.tasks:...` imports
        assert main(["run", str(path), "--quiet"]) == 0
    return folder


@pytest.fixture
def study(stored: Path, tmp_path: Path) -> Path:
    for name in ("study.yaml", "study.db"):
        (tmp_path / name).write_bytes((stored / name).read_bytes())
    return tmp_path / "study.yaml"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize(("kind", "option"), OUTPUTS)
def test_no_output_replaces_a_study_file_by_any_name_or_link_even_forced(
    study: Path, kind: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, db = study.parent, study.with_suffix(".db")
    os.link(db, folder / "hard.db")
    os.link(study, folder / "hard.yaml")
    (folder / "soft.db").symlink_to(db.name)
    lock = folder / "study.db.runner.lock"
    lock.write_text("autotune (pid 1)\n")
    before = snapshot(folder)
    cases = {
        db: "the study's storage",
        folder / "hard.db": "the study's storage",
        folder / "soft.db": "the study's storage",
        folder / "sub" / ".." / "study.db": "the study's storage",
        study: "the study file",
        folder / "hard.yaml": "the study file",
        lock: "the study's runner lock",
        folder / "study.db-journal": "the storage's rollback journal",
    }
    (folder / "sub").mkdir()
    for target, what in cases.items():
        for force in ((), ("--force",)):
            code, out, err = run_cli(*command(study, kind, option, target, *force), capsys=capsys)
            assert code == 2 and out == "", (target, err)
            assert (
                err == f"autotune: error: {option} {target}: that is {what}; write it elsewhere\n"
            )
    assert snapshot(folder) == before
    assert not (
        folder / "study.db-journal"
    ).exists()  # a hot journal beside the database would roll it back
    assert len(load(study).get_trials()) == 2


@pytest.mark.parametrize(("kind", "option"), OUTPUTS)
def test_a_users_file_is_replaced_only_with_force(
    study: Path, kind: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = study.parent / "my_task.py"
    mine.write_text("x = 1\n")
    code, _, err = run_cli(*command(study, kind, option, mine), capsys=capsys)
    assert code == 2 and err == (
        f"autotune: error: {option} {mine}: the file exists and was not written by autotune; "
        f"choose another name, or pass --force to replace it\n"
    )
    assert mine.read_text() == "x = 1\n"
    assert run_cli(*command(study, kind, option, mine, "--force"), capsys=capsys)[0] == 0
    assert mine.read_text() != "x = 1\n"


@pytest.mark.parametrize(("kind", "option"), OUTPUTS)
def test_an_earlier_output_is_replaced_and_other_links_to_it_keep_theirs(
    study: Path, kind: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = study.parent / "out"
    assert run_cli(*command(study, kind, option, out), capsys=capsys)[0] == 0
    first = out.read_bytes()
    os.link(out, study.parent / "kept")
    os.chmod(out, 0o640)
    # no --force: it is autotune's own
    assert run_cli(*command(study, kind, option, out), capsys=capsys)[0] == 0
    assert (
        study.parent / "kept"
    ).read_bytes() == first  # written beside and renamed, not through the link
    assert out.stat().st_ino != (study.parent / "kept").stat().st_ino
    assert oct(out.stat().st_mode & 0o777) == oct(0o640)


def test_every_export_format_replaces_its_own_earlier_export(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for fmt in ("json", "yaml", "args", "torch", "lightning", "hf"):
        target = study.parent / f"best.{fmt}"
        for _ in range(2):
            code, _, err = run_cli(
                "export", str(study), "--format", fmt, "-o", str(target), capsys=capsys
            )
            assert code == 0, (fmt, err)
    assert json.loads((study.parent / "best.json").read_text())["batch_size"] in (16, 32, 64)


def test_report_checks_every_output_before_writing_any(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = study.parent / "trials.csv"
    code, _, err = run_cli(
        "report", str(study), "--csv", str(csv), "--html", str(study), capsys=capsys
    )
    assert code == 2 and "--html" in err
    assert not csv.exists()


def test_a_device_is_written_through_not_replaced(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli("report", str(study), "--csv", os.devnull, capsys=capsys)
    assert code == 0 and err == f"autotune: wrote {os.devnull}\n"
    assert Path(os.devnull).is_char_device()


def test_a_storage_that_is_the_study_file_is_refused(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = study.read_bytes()
    for url in (f"journal:///{study}", f"sqlite:///{study}"):
        code, _, err = run_cli("run", str(study), "--storage", url, capsys=capsys)
        assert code == 2 and err.strip().endswith(
            f"storage: {url} is the study file itself; "
            f"choose another file with --storage or storage:"
        ), err
    assert study.read_bytes() == before


def test_dev_stdout_into_a_pipe_and_a_dash_write_to_standard_output(study: Path) -> None:
    """`-o /dev/stdout` names a pipe here by no path of its own (/proc/self/fd/1 -> pipe:[N]);
    `-o -` is standard output: no file named "-" appears."""
    repo = Path(__file__).resolve().parent.parent
    outs = []
    for target in ("/dev/stdout", "-"):
        done = subprocess.run(
            [sys.executable, "-m", "autotune", "export", "study.yaml", "--format", "yaml"]
            + ["-o", target],
            cwd=study.parent,
            env={**os.environ, "PYTHONPATH": str(repo)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        outs.append(done.stdout)
    assert outs[0] == outs[1] and "batch_size:" in outs[0], outs
    assert not (study.parent / "-").exists()


def test_a_table_or_page_to_standard_output_takes_the_text_report_s_place(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli("report", str(study), "--csv", "-", capsys=capsys)
    assert code == 0 and out.splitlines()[0].startswith("number,"), out[:300]
    assert "Study study" not in out and not (study.parent / "-").exists()
    before = snapshot(study.parent)
    code, out, err = run_cli("report", str(study), "--csv", "-", "--json", capsys=capsys)
    assert code == 2 and out == "" and "--csv and --json would all write to standard output" in err
    assert snapshot(study.parent) == before
