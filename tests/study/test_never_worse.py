"""Never worse than the baseline: what fresh seeds did not show is never recommended, and every
reading of the study (text, JSON, HTML, export) says the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

import autotune
from autotune.cli import main
from autotune.record import verdict

# A training command: on the study's seeds it reaches the target; on the confirmation's fresh
# seeds (50,000 and up) only the baseline's configuration does, and only on the second of them.
TRAIN = """
import json, os, sys, time
seed, lr = int(sys.argv[1]), float(sys.argv[2])
baseline = abs(lr - 0.05) < 1e-12
reaches = seed < 50_000 or (baseline and seed == 50_001)
fd = int(os.environ["AUTOTUNE_REPORT_FD"])
for step in range(1, 9):
    time.sleep(0.01 if not baseline else 0.03)
    metric = 0.9 if reaches and step >= 4 else 0.3
    os.write(fd, (json.dumps({"step": step, "metric": metric, "total_steps": 8}) + "\\n").encode())
"""


def command_study(folder: Path) -> Path:
    (folder / "train.py").write_text(TRAIN)
    study = {
        "task": {"command": f"{sys.executable} train.py {{seed}} {{lr}}"},
        # a score made of a loss, higher being better: said so, as such a name asks
        "target": {"metric": "val_loss_score", "value": 0.8, "direction": "maximize"},
        "space": {"lr": {"low": 0.1, "high": 0.5, "log": True}},
        "baseline": {"lr": 0.05},
        "budget": {"trials": 3, "max_epochs": 1, "max_seconds": 20},
        "confirm": {"top": 1, "runs": 2},
        "probe": "none",
    }
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    return folder / "study.yaml"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_command_that_misses_on_its_fresh_seeds_is_never_the_winner_in_any_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = command_study(tmp_path)
    code, out, err = cli(capsys, "run", str(study))
    assert code == 0, err
    assert "reached in 0/2 runs" in out and "Winner: the baseline (confirmed)" in out, out
    assert "single run" not in out.split("Winner:")[1]
    why = (
        "No configuration the study found reached the target on most of its fresh seeds and as "
        "often as the baseline: keep the baseline."
    )
    assert why in out

    code, out, _ = cli(capsys, "report", str(study), "--json", "--html", str(tmp_path / "r.html"))
    report = json.loads(out)
    assert code == 0 and report["best"]["trial"] is None and report["best"]["label"] == "baseline"
    assert report["confirmation"]["decision"]["outcome"] == verdict.MISSED
    assert why in (tmp_path / "r.html").read_text()

    code, _, err = cli(capsys, "export", str(study), "--format", "yaml", "-o", str(tmp_path / "y"))
    exported = (tmp_path / "y").read_text()
    assert code == 0 and why in err  # said, for formats that hold no comment too
    assert "the baseline" in exported.splitlines()[0] and why in exported.splitlines()[0]
    assert yaml.safe_load(exported)["lr"] == 0.05  # the baseline's learning rate, not a trial's


def test_a_lead_inside_the_noise_reads_not_resolved_and_keeps_the_baseline(tmp_path: Path) -> None:
    """A candidate 1% faster than the baseline on every seed, where the seed moves a run's time by
    up to 90%: no number of seeds up to the cap resolves it."""

    def objective(config: dict, seed: int) -> tuple[float, float]:
        if config["lr"] != 0.05 and seed < 50_000:  # the study's own run of it: a lucky one
            return 0.5, 0.9
        spread = 1 + 0.9 * ((seed * 7919) % 13) / 13
        return spread * (1.0 if config["lr"] == 0.05 else 0.99), 0.9

    storage = f"sqlite:///{tmp_path / 'noise.db'}"
    summary = autotune.tune(
        objective=objective,
        target=0.8,
        metric="score",
        name="noise",
        storage=storage,
        space={"lr": [0.05, 0.2], "batch_size": 32, "scheduler": "constant"},
        baseline={"lr": 0.05},
        budget={"trials": 3, "max_epochs": 1},
        confirm={"top": 1},  # runs: auto
    )
    decision = summary.confirmation.decision
    assert decision["outcome"] == verdict.NOT_RESOLVED and summary.best.is_baseline
    assert summary.confirmation.configs["baseline"]["runs"] == 8  # seeds added up to the cap
    assert len(summary.confirmation.added_seeds) == 5
    assert summary.confirmation.why_baseline().startswith("Not resolved: trial")
    assert "keep the baseline, or raise confirm.runs" in summary.confirmation.why_baseline()
    import optuna

    from autotune.report.results import trial_records
    from autotune.report.text import render

    trials = optuna.load_study(study_name="noise", storage=storage).get_trials()
    text = render(summary, trial_records(trials))
    leader = decision["leader"]
    assert f"on 3 fresh seeds and 5 more for {leader} and the baseline (confirm.runs: auto)" in text
    assert "Winner: the baseline (confirmed)" in text and "Not resolved: " in text


def test_every_trial_stores_how_busy_the_machine_was_and_the_report_says_when_it_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses

    import optuna

    from autotune.record import schema
    from autotune.record.summary import Counts, Summary
    from autotune.spec.sections import Target
    from autotune.train.measure import cpu_count

    study = command_study(tmp_path)
    assert cli(capsys, "run", str(study), "--trials", "2")[0] == 0
    trials = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}")
    for trial in trials.trials:
        load = schema.other_load(trial)
        assert load["cores"] == cpu_count() and load["other_cores"] >= 0
    _, out, _ = cli(capsys, "report", str(study), "--json")
    assert json.loads(out)["trials_load"]["trials"] == 2

    quiet = Summary(study="s", target=Target("accuracy", 0.9), counts=Counts(*[0] * 12))
    assert quiet.load_sentence() == ""
    steady = {"trials": 20, "median": 1.9, "min": 1.8, "max": 2.0, "cores": 2}
    said = dataclasses.replace(quiet, trials_load=steady).load_sentence()
    assert said.startswith("While the trials trained, other processes kept 1.8-2.0 of 2 cores")
    assert "changing load" not in said
    moved = {**steady, "min": 0.1}
    said = dataclasses.replace(quiet, trials_load=moved).load_sentence()
    assert "measured under changing load" in said and "confirmation" in said
