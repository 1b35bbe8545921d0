"""A training script tuned in its own terms: values mapped to its option's words, booleans as
Python writes them, the folder it runs in, the threads it gets, the knobs it never names left
alone, and its own command line back out of `autotune export --format command`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune import progress
from autotune.cli import main
from autotune.errors import SpecError
from autotune.record import schema
from autotune.runners import command_inputs
from autotune.search import recipe
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.spec.study_file import from_mapping
from autotune.train.config import Limits, TrialConfig

# Records what it was given (keyed by its seed), then prints GPT-style loss lines.
RECORDS = """
import json, os, sys, time
args = sys.argv[1:]
seed = next(a.split("=", 1)[1] for a in args if a.startswith("--seed="))
seen = {"argv": args, "cwd": os.getcwd(), "tag": os.environ.get("TAG"),
        "omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS")}
with open(f"seen-{seed}.json", "w") as file:
    json.dump(seen, file)
for step in range(4):
    time.sleep(0.02)
    print(f"step {step}: val loss {2.0 - 0.5 * step:.2f}", flush=True)
"""

STUDY = {
    "task": {
        "command": "python ../scripts/records.py --lr={lr} --dtype={precision} "
        "--channels_last={channels_last} --batch_size={batch_size} --seed={seed}",
        "cwd": "work",
        "env": {"TAG": "w{batch_size}"},
        "values": {"precision": {"bf16": "bfloat16", "fp32": "float32"}},
        "metric_from": "val loss ([0-9.]+)",
    },
    "target": {"metric": "val_loss", "value": 1.2, "direction": "minimize"},
    "space": {
        "lr": [0.01, 0.02],
        "batch_size": [16, 32],
        "precision": ["fp32", "bf16"],
        "channels_last": [True, False],
        "num_workers": [0, 1],  # never named by the command: fixed, not searched
        "compile": False,
    },
    "budget": {"trials": 4, "max_seconds": 30},
    "prune": "none",
    "confirm": {"top": 0},
}


def study_in(folder: Path, study: dict = STUDY) -> Path:
    (folder / "scripts").mkdir()
    (folder / "scripts" / "records.py").write_text(RECORDS)
    (folder / "work").mkdir()
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_a_script_gets_its_own_words_runs_in_its_folder_and_its_command_comes_back_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_in(tmp_path)
    assert main(["run", str(path)]) == 0
    err = capsys.readouterr().err
    [notice] = [line for line in err.splitlines() if "the command never names" in line]
    assert "{num_workers}" in notice and "not searched and not exported" in notice
    assert "{lr}" not in notice and "{channels_last}" not in notice
    trials = optuna.load_study(
        study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}"
    ).get_trials()
    work = tmp_path / "work"
    threads = str(recipe.training_threads(recipe.cores(), 0))
    runs = {}
    for trial in trials:
        config, seed = schema.trained_config(trial), schema.seed(trial)
        assert config["num_workers"] == 0  # the baseline's, in every trial
        seen = json.loads((work / f"seen-{seed}.json").read_text())
        runs[trial.number] = seen
        words = {"fp32": "float32", "bf16": "bfloat16"}
        assert seen["argv"][:4] == [
            f"--lr={config['lr']:g}",
            f"--dtype={words[config['precision']]}",
            f"--channels_last={config['channels_last']}",  # True / False, as Python writes them
            f"--batch_size={config['batch_size']}",
        ]
        assert seen["cwd"] == str(work) and seen["tag"] == f"w{config['batch_size']}"
        assert seen["omp"] == seen["mkl"] == threads  # as an in-process trial sets torch's

    assert main(["report", str(path)]) == 0
    logs = tmp_path / "study.db.logs"
    assert f"Each run's output: {logs}/run-SEED.log" in capsys.readouterr().out
    assert {p.name for p in logs.iterdir()} == {f"run-{schema.seed(t)}.log" for t in trials}

    assert main(["export", str(path), "--format", "json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert "num_workers" not in exported and "compile" not in exported
    assert {"lr", "batch_size", "precision", "channels_last"} <= set(exported)

    line_file = tmp_path / "best.sh"
    assert main(["export", str(path), "--format", "command", "-o", str(line_file)]) == 0
    comment, line = line_file.read_text().splitlines()
    assert comment.startswith("# autotune study study, trial ")
    winner = int(comment.split("trial ")[1].split(" ")[0])
    for seen in work.glob("seen-*.json"):
        seen.unlink()
    path_env = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    # run as it is, from elsewhere, by a shell: the same arguments, folder and environment
    subprocess.run(["bash", "-c", line], cwd="/", env={**os.environ, "PATH": path_env}, check=True)
    [again] = work.glob("seen-*.json")
    assert json.loads(again.read_text()) == runs[winner]


def test_a_study_s_threads_yield_to_what_its_env_says(tmp_path: Path) -> None:
    config = TrialConfig.from_mapping({**complete(DEFAULT_BASELINE), "num_workers": 1})
    limits = Limits(target=0.5, max_epochs=1, max_seconds=10, eval_every=1)
    common = dict(config=config, limits=limits, device=None, seed=1, metric_name="val_loss")
    with_workers = str(recipe.training_threads(recipe.cores(), 1))
    for env, expected in (({}, with_workers), ({"OMP_NUM_THREADS": "3"}, "3")):
        _, child = command_inputs.inputs_for(["python"], env, folder=tmp_path, **common)
        assert child["OMP_NUM_THREADS"] == expected
        assert child["MKL_NUM_THREADS"] == with_workers


@pytest.mark.parametrize(
    ("change", "key", "said"),
    [
        ({"values": {"precision": {"int8": "x"}}}, "task.values.precision.int8", "takes one of"),
        ({"values": {"channels_last": {3: "x"}}}, "task.values.channels_last.3", "true or false"),
        ({"values": {"num_workers": {0: "none"}}}, "task.values.num_workers", "it names none"),
        ({"values": {"widht": {1: "small"}}}, "task.values.widht", "a knob or parameter"),
        ({"values": {"precision": "bf16"}}, "task.values.precision", "a mapping of the knob"),
        ({"cwd": "nowhere"}, "task.cwd", "an existing folder"),
        ({"command": "python -u ../scripts/gone.py --lr={lr}"}, "task.command", "is not a file"),
    ],
)
def test_a_value_map_or_folder_that_cannot_work_is_refused_naming_its_key(
    tmp_path: Path, change: dict, key: str, said: str
) -> None:
    path = study_in(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["task"].update(change)
    with pytest.raises(SpecError) as refused:
        from_mapping(raw, path=path)
    assert refused.value.key == key and said in str(refused.value), str(refused.value)


def test_the_confirmation_shows_each_run_s_steps_and_last_metric_as_a_trial_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "LINE_EVERY_SECONDS", 1e-9)  # a line at every report
    study = {
        **STUDY,
        "task": {**STUDY["task"], "step_from": "step ([0-9]+):"},
        "budget": {"trials": 1, "max_seconds": 30},
        "confirm": {"top": 1, "runs": 1},
    }
    assert main(["run", str(study_in(tmp_path, study))]) == 0
    err = capsys.readouterr().err
    shown = [line for line in err.splitlines() if line.startswith("confirming ")]
    for label in ("trial 0", "baseline"):
        # each run's steps and its last metric before the one that reached the target (1.0)
        assert f"confirming {label}, seed 50000: 2 steps, val_loss=1.5000" in shown, shown


SLOW_SECOND_TRIAL = """
import sys, time
pace = 1.0 if int(sys.argv[1]) % 100_000 == 1 else 0.02  # trial 1's seed ends in 1
for step in range(1, 6):
    time.sleep(pace)
    print(f"step {step}: val loss {3.0 - 0.5 * step:.2f}", flush=True)
"""


def test_a_study_read_only_from_output_lines_prunes_confirms_and_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(SLOW_SECOND_TRIAL)
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": {
                    "command": "python train.py {seed} --lr={lr}",
                    "metric_from": "val loss ([0-9.]+)",
                },
                "target": {"metric": "val_loss", "value": 1.2, "direction": "minimize"},
                "space": {"lr": [0.01, 0.02]},
                "budget": {"trials": 3, "max_seconds": 30},
                "prune": "incumbent",
                "confirm": {"top": 1, "runs": 1},
            }
        )
    )
    assert main(["run", str(path)]) == 0
    study = optuna.load_study(study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}")
    trials = study.get_trials()
    # trial 1 passed trial 0's time long before its val loss came under 1.2: stopped there
    assert trials[1].state.name == "PRUNED" and schema.reason(trials[1]).startswith("pruned: ")
    assert schema.measured(trials[0])["best_metric"] == 1.0  # step 4's, the first at or below
    assert schema.confirmation(study.user_attrs)["runs"]
    capsys.readouterr()
    assert main(["export", str(path), "--format", "command"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith(f"cd {tmp_path} && ") and " python train.py " in line
