"""A lower-is-better target (a loss): reached at or below its value, every figure read the right
way round; a target named like a loss without a direction is refused rather than read wrong."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
import yaml

import autotune
from autotune.cli import main
from autotune.errors import SpecError
from autotune.record import objectives, schema
from autotune.spec.study_file import from_mapping
from autotune.train.config import Limits, TrialResult
from tests.record.test_objective import run as objective_run

STUDY = Path("loss.yaml")


def target_of(**target: object):
    return from_mapping(
        {"task": "digits", "target": {"metric": "val_loss", "value": 1.7, **target}}, path=STUDY
    ).target


def test_a_loss_target_says_its_direction_or_is_refused_naming_the_key() -> None:
    assert target_of(direction="minimize").minimize
    assert target_of(direction="minimize").text == "val_loss <= 1.7"
    assert not target_of(direction="maximize").minimize  # the user's word stands
    for metric in ("val_loss", "eval_loss", "error_rate", "top1_err", "perplexity", "val mse"):
        with pytest.raises(SpecError) as refused:
            from_mapping({"task": "digits", "target": {"metric": metric, "value": 1}}, path=STUDY)
        assert refused.value.key == "target.direction"
        assert "add direction: minimize" in str(refused.value) and metric in str(refused.value)
    for metric in ("accuracy", "f1", "bleu", "score", "interrupts_handled"):  # higher is better
        spec = from_mapping(
            {"task": "digits", "target": {"metric": metric, "value": 0.5}}, path=STUDY
        )
        assert not spec.target.minimize
    with pytest.raises(SpecError, match="target.direction: got 'down'"):
        target_of(direction="down")
    with pytest.raises(SpecError, match="maximize for accuracy"):
        from_mapping(
            {
                "task": "digits",
                "target": {"metric": "accuracy", "value": 0.9, "direction": "minimize"},
            },
            path=STUDY,
        )


def run(best: float, reached: bool, final: float | None = None) -> TrialResult:
    """A run whose best metric is `best` (its only evaluation, or `final` after it)."""
    finals = (best,) if final is None else (best, final)
    return objective_run(seconds=2.0, reached_at=1.0 if reached else None, finals=finals)


def test_reached_at_or_below_and_the_constraint_and_best_the_right_way_round() -> None:
    limits = Limits(target=1.7, max_epochs=1, max_seconds=1, eval_every=1, minimize=True)
    assert limits.reached(1.7) and limits.reached(1.2) and not limits.reached(1.71)
    assert limits.better(1.2, 1.9) == 1.2
    time_to_target = objectives.of("time_to_target")
    met = time_to_target.outcome([run(1.5, True), run(1.6, True)], target=1.7, minimize=True)
    assert met.constraint == pytest.approx(-0.1)  # the worse run's best, 1.6, is 0.1 under
    missed = time_to_target.outcome([run(1.5, True), run(2.5, False)], target=1.7, minimize=True)
    assert missed.constraint > 0 and missed.metric == 2.5
    fixed = objectives.of("fixed_schedule")
    assert fixed.outcome([run(1.0, True, final=1.6)], target=1.7, minimize=True).constraint < 0
    assert fixed.outcome([run(1.0, True, final=1.8)], target=1.7, minimize=True).constraint > 0
    finals = [{"final_metric": 1.6, "train_seconds": 3.0, "stop_reason": "max_epochs"}]
    times, mean = fixed.confirmed_times(finals, target=1.7, minimize=True)
    assert times == [3.0] and mean == 1.6
    times, _ = fixed.confirmed_times(finals, target=1.5, minimize=True)
    assert times == [math.inf]
    failed = [{"final_metric": None, "train_seconds": 3.0}]
    assert fixed.confirmed_times(failed, target=1.7, minimize=True)[0] == [math.inf]


def test_a_study_on_a_loss_stops_each_run_at_or_below_it_and_reports_it_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An objective whose loss falls with the learning rate toward 0.1: a trial reaches the target
    where its loss is at or below it, never where it is above (read as accuracy, every trial
    would have reached it at once)."""

    def objective(config: dict) -> tuple[float, float]:
        loss = 1.0 + abs(math.log10(config["lr"] / 0.1))
        return 10.0 / config["batch_size"], loss

    storage = f"sqlite:///{tmp_path / 'loss.db'}"
    summary = autotune.tune(
        objective=objective,
        target=1.3,
        metric="val_loss",
        direction="minimize",
        name="loss",
        storage=storage,
        space={"lr": {"low": 0.001, "high": 1.0, "log": True}, "batch_size": [16, 32, 64]},
        budget={"trials": 10},
        confirm={"top": 0},
    )
    trials = optuna.load_study(study_name="loss", storage=storage).get_trials()
    for trial in trials:
        loss = 1.0 + abs(math.log10(trial.params["lr"] / 0.1))
        feasible = trial.constraints["target"] <= 0
        assert feasible == (loss <= 1.3), (trial.params, loss)
    assert any(t.constraints["target"] <= 0 for t in trials) and any(
        t.constraints["target"] > 0 for t in trials
    )
    assert summary.best is not None
    assert 1.0 + abs(math.log10(summary.best.params["lr"] / 0.1)) <= 1.3
    assert summary.target.minimize
    code = main(["report", "--storage", storage, "--study", "loss", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["target"] == {"metric": "val_loss", "value": 1.3, "minimize": True}
    assert main(["report", "--storage", storage, "--study", "loss"]) == 0
    assert "Target: val_loss <= 1.3" in capsys.readouterr().out
    stored = optuna.load_study(study_name="loss", storage=storage).user_attrs
    assert schema.definition(stored)["target"]["minimize"] is True


DESCENDS = """
import json, os, time
fd = int(os.environ["AUTOTUNE_REPORT_FD"])
for step, loss in enumerate([2.0, 1.2, 0.6, 0.45, 0.3], start=1):
    time.sleep(0.05)
    os.write(fd, (json.dumps({"step": step, "val_loss": loss}) + "\\n").encode())
"""


def test_a_command_s_loss_reaches_the_target_at_the_first_report_at_or_below_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "descends.py").write_text(DESCENDS)
    study = tmp_path / "study.yaml"
    study.write_text(
        "task: {command: 'python descends.py'}\n"
        "target: {metric: val_loss, value: 0.5, direction: minimize}\n"
        "space: {lr: 0.01, batch_size: 32}\n"
        "budget: {trials: 1, max_seconds: 30}\n"
        "confirm: {top: 0}\n"
    )
    assert main(["run", str(study)]) == 0
    out = capsys.readouterr().out
    [trial] = optuna.load_study(
        study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}"
    ).get_trials()
    result = schema.measured(trial)
    # stopped at its 4th report, 0.45: the first at or below 0.5
    assert result["reached"] and result["best_metric"] == 0.45
    assert [point[2] for point in result["curve"]] == [2.0, 1.2, 0.6, 0.45]
    assert trial.constraints["target"] == pytest.approx(0.45 - 0.5)
    assert "Target: val_loss <= 0.5" in out


GPT_STYLE = """
import sys, time
lr = float(sys.argv[1].split("=")[1])
for step in range(0, 60, 10):
    time.sleep(0.05)
    loss = 3.0 - step * lr
    print(f"step {step}: train loss {loss + 0.1:.4f}, val loss {loss:.4f}", flush=True)
    print(f"iter {step}: time 12.3ms", flush=True)
"""
HF_STYLE = """
import sys, time
for epoch in range(1, 6):
    time.sleep(0.05)
    print({'eval_loss': 2.0 / epoch, 'eval_runtime': 0.5, 'epoch': float(epoch)}, flush=True)
"""


def command_study(folder: Path, script: str, command: str, task: str, value: float) -> Path:
    (folder / "train.py").write_text(script)
    study = folder / "study.yaml"
    study.write_text(
        f"task: {{command: '{command}', {task}}}\n"
        f"target: {{metric: val_loss, value: {value}, direction: minimize}}\n"
        "space: {lr: [0.02, 0.04], batch_size: 32}\n"
        "budget: {trials: 2, max_seconds: 30}\n"
        "prune: none\n"
        "confirm: {top: 0}\n"
    )
    return study


def trials_of(folder: Path) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{folder / 'study.db'}"
    return optuna.load_study(study_name="study", storage=storage).get_trials()


def test_a_script_s_own_output_lines_are_its_reports_with_no_line_of_it_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPT-style `step N: train loss X, val loss Y` line gives the metric and the step; lines
    that match nothing (`iter N: time ...`) are left alone."""
    study = command_study(
        tmp_path,
        GPT_STYLE,
        "python train.py --lr={lr}",
        "metric_from: 'val loss ([0-9.]+)', step_from: 'step ([0-9]+):', "
        "loss_from: 'train loss ([0-9.]+)'",
        value=2.0,
    )
    assert main(["run", str(study)]) == 0
    for trial in trials_of(tmp_path):
        lr, result = trial.params["lr"], schema.measured(trial)
        # each val loss line until the first at or below 2.0: 3.0, 2.6, 2.2, 1.8 at lr 0.04
        expected = [round(3.0 - step * lr, 4) for step in range(0, 60, 10)]
        expected = expected[: next(i for i, v in enumerate(expected) if v <= 2.0) + 1]
        assert result["reached"] and [p[2] for p in result["curve"]] == expected, lr
    assert "Target: val_loss <= 2" in capsys.readouterr().out


def test_a_hugging_face_trainer_s_eval_line_is_read_as_printed(tmp_path: Path) -> None:
    study = command_study(
        tmp_path,
        HF_STYLE,
        "python train.py",
        "metric_from: \"'eval_loss': ([0-9.eE+-]+)\", epoch_from: \"'epoch': ([0-9.]+)\"",
        value=0.6,
    )
    assert main(["run", str(study)]) == 0
    result = schema.measured(trials_of(tmp_path)[0])
    # 2.0, 1.0, 0.667, 0.5: reached in the fourth epoch
    assert result["reached"] and result["best_metric"] == 0.5 and len(result["curve"]) == 4
    assert result["curve"][-1][1] == 4.0


def test_a_pattern_that_never_matches_fails_the_trial_naming_it_and_the_last_lines(
    tmp_path: Path,
) -> None:
    study = command_study(
        tmp_path, GPT_STYLE, "python train.py --lr={lr}", "metric_from: 'eval_loss=([0-9.]+)'", 1
    )
    assert main(["run", str(study)]) == 1  # no trial reached the target
    reasons = [t.user_attrs["reason"] for t in trials_of(tmp_path)]
    assert reasons and all(
        "no line of its output matched metric_from 'eval_loss=([0-9.]+)'" in r
        and "| iter 50: time 12.3ms" in r
        for r in reasons
    ), reasons


def test_a_pattern_without_a_group_or_not_a_regular_expression_is_refused(tmp_path: Path) -> None:
    for pattern, said in (
        ("val loss [0-9.]+", "a group around the number"),
        ("(", "not a regular"),
    ):
        study = command_study(
            tmp_path, GPT_STYLE, "python train.py", f"metric_from: '{pattern}'", 1.0
        )
        with pytest.raises(SpecError, match=f"task.metric_from: got .*{said}"):
            from_mapping(yaml.safe_load(study.read_text()), path=study)


def test_each_run_s_output_is_kept_beside_the_storage_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.runners import command_log

    monkeypatch.setattr(command_log, "MAX_BYTES", 200)
    study = command_study(
        tmp_path, GPT_STYLE, "python train.py --lr={lr}", "metric_from: 'nothing ([0-9]+)'", 1.0
    )
    assert main(["run", str(study)]) == 1
    logs = tmp_path / "study.db.logs"
    for trial in trials_of(tmp_path):
        log = logs / f"run-{trial.user_attrs[schema.SEED]}.log"
        text = log.read_text()
        assert text.startswith("step 0: train loss 3.1000, val loss 3.0000\niter 0: time 12.3ms\n")
        kept, _, note = text.rpartition("[autotune: ")
        assert len(kept.encode()) <= 200 and note.endswith("more bytes of output not kept]\n")
        assert trial.user_attrs["reason"].endswith(f"; its output: {log}")


def test_a_log_never_writes_through_a_link_to_another_file(tmp_path: Path) -> None:
    """A run's log whose name is a hard link to the study's database, or whose folder is a link:
    nothing is written, and the file is left as it was."""
    from autotune.runners.command_log import OutputLog

    precious = tmp_path / "study.db"
    precious.write_bytes(b"SQLite format 3\0 and the study")
    logs = tmp_path / "study.db.logs"
    logs.mkdir()
    (logs / "run-7.log").hardlink_to(precious)
    log = OutputLog(logs, seed=7)
    log.write(["step 1: val loss 2.0"])
    log.close()
    assert log.path is None and precious.read_bytes() == b"SQLite format 3\0 and the study"
    linked = tmp_path / "other.logs"
    linked.symlink_to(tmp_path)
    (tmp_path / "run-8.log").write_text("kept")
    log = OutputLog(linked, seed=8)
    log.write(["anything"])
    log.close()
    assert log.path is None and (tmp_path / "run-8.log").read_text() == "kept"
