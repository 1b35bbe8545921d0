"""`autotune report --tensorboard DIR`: every stored learning curve, with its training loss where
it was stored, as TensorBoard event files, read back here with tensorboard's own reader; from the
storage alone, so the stored study of an earlier autotune has them too."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.record import schema

REPO = Path(__file__).resolve().parents[2]
STORED = REPO / "tests" / "data" / "stored_study"
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is in the test extra: bash scripts/test.sh installs it",
)


@pytest.fixture
def study(tmp_path: Path) -> Path:
    for path in STORED.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "small.yaml"


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    accumulator = event_accumulator.EventAccumulator(str(run))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def stored(study_file: Path) -> optuna.Study:
    return optuna.load_study(
        study_name="small", storage=f"sqlite:///{study_file.with_suffix('.db')}"
    )


def test_every_stored_curve_reads_back_as_it_was_stored(study: Path) -> None:
    folder = study.parent / "tb"
    assert main(["report", str(study), "--tensorboard", str(folder)]) == 0
    kept = stored(study)
    trials = {t.number: schema.measured(t).get("curve") for t in kept.get_trials()}
    trials = {n: c for n, c in trials.items() if c}
    assert {p.name for p in folder.glob("trial-*")} == {f"trial-{n}" for n in trials}
    for number, curve in trials.items():
        read = scalars(folder / f"trial-{number}", "accuracy")
        assert [step for step, _ in read] == [round(seconds * 1000) for seconds, _, _ in curve]
        assert [value for _, value in read] == pytest.approx([m for _, _, m in curve])
        epochs = scalars(folder / f"trial-{number}", "epochs")
        assert [value for _, value in epochs] == pytest.approx([e for _, e, _ in curve])
    confirmation = schema.confirmation(kept.user_attrs)
    runs = [r for r in confirmation["runs"] if r.get("curve")]
    assert runs and len(list((folder / "confirmation").iterdir())) == len(runs)
    first = runs[0]
    name = f"{first['label'].replace(' ', '-')}-seed-{first['seed']}"
    read = scalars(folder / "confirmation" / name, "accuracy")
    assert [value for _, value in read] == pytest.approx([m for _, _, m in first["curve"]])


def test_a_second_report_replaces_its_curves_rather_than_doubling_them(study: Path) -> None:
    folder = study.parent / "tb"
    for _ in range(2):
        assert main(["report", str(study), "--tensorboard", str(folder)]) == 0
    assert all(len(list(run.iterdir())) == 1 for run in folder.glob("trial-*"))
    once = scalars(next(folder.glob("trial-*")), "accuracy")
    assert len(once) == len({step for step, _ in once})


def test_the_study_s_own_file_is_never_removed_even_named_like_an_event_file(
    study: Path,
) -> None:
    """A hard link to the storage inside a run's folder, named as event files are: the replacing
    of earlier event files passes it by."""
    run = study.parent / "tb" / "trial-0"
    run.mkdir(parents=True)
    os.link(study.with_suffix(".db"), run / "events.out.tfevents.keep")
    before = study.with_suffix(".db").read_bytes()
    assert main(["report", str(study), "--tensorboard", str(run.parent)]) == 0
    assert (run / "events.out.tfevents.keep").exists()
    assert study.with_suffix(".db").read_bytes() == before


def test_a_file_for_the_folder_is_one_line_and_exit_2(
    study: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (study.parent / "tb").write_text("not a folder")
    assert main(["report", str(study), "--tensorboard", str(study.parent / "tb")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "that is a file; name a folder" in err


def test_without_tensorboard_installed_it_says_how_to_install_it(study: Path) -> None:
    blocked = (
        "import sys; sys.modules['tensorboard'] = None; from autotune.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocked, "report", str(study), "--tensorboard", "tb"],
        capture_output=True,
        text=True,
        cwd=study.parent,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'autotune[tensorboard]'" in done.stderr
    assert "Traceback" not in done.stderr and not (study.parent / "tb").exists()


def test_the_study_s_own_old_curves_have_no_loss_and_its_probe_is_written(study: Path) -> None:
    """A study stored before the loss was: its curves without the tag, its report as before."""
    folder = study.parent / "tb"
    assert main(["report", str(study), "--tensorboard", str(folder)]) == 0
    for run in [*folder.glob("trial-*"), *(folder / "confirmation").iterdir()]:
        accumulator = event_accumulator.EventAccumulator(str(run))
        accumulator.Reload()
        assert "accuracy" in accumulator.Tags()["scalars"]
        assert "loss" not in accumulator.Tags()["scalars"]
    assert (folder / "probe" / "runs").is_dir()


def write_study(folder: Path, *, probe: str) -> Path:
    study = {
        "task": "tests.tasks:blobs",
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {"lr": [0.02, 0.2], "batch_size": 32, "num_workers": 0, "precision": "fp32"},
        "probe": probe,
        "budget": {"trials": 2, "max_epochs": 2, "max_seconds": 10, "eval_every": 0.5},
        "confirm": {"top": 1, "runs": 1},
        "isolation": "none",
    }
    path = folder / f"{probe}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_each_run_s_loss_is_a_point_beside_each_of_its_metric_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study run now: every trial's first run and every confirmation run has `loss` at the
    steps of its metric, with the values stored."""
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports
    path = write_study(tmp_path, probe="none")
    assert main(["run", str(path), "--quiet"]) == 0
    folder = tmp_path / "tb"
    assert main(["report", str(path), "--tensorboard", str(folder)]) == 0
    kept = optuna.load_study(study_name="none", storage=f"sqlite:///{tmp_path / 'none.db'}")
    trials = {f"trial-{t.number}": schema.measured(t) for t in kept.get_trials()}
    stored = {name: run for name, run in trials.items() if run.get("curve")}
    confirmation = schema.confirmation(kept.user_attrs)["runs"]
    for run in confirmation:
        stored[f"confirmation/{run['label'].replace(' ', '-')}-seed-{run['seed']}"] = run
    assert len(confirmation) == 2 and len(stored) >= 3
    for name, run in stored.items():
        metric, loss = scalars(folder / name, "accuracy"), scalars(folder / name, "loss")
        assert [step for step, _ in loss] == [step for step, _ in metric] and loss
        assert all(math.isfinite(value) and value > 0 for _, value in loss)
        assert [value for _, value in loss] == pytest.approx(run["train_loss"], rel=1e-6)
