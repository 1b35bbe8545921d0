"""The README's second example: studies/chargpt.yaml tunes studies/chargpt/train.py, a script
that knows nothing of autotune, through its own overrides and the loss lines it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from autotune.runners.command import command_trial
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.spec.study_file import load
from autotune.train.config import Limits, TrialConfig

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "studies" / "chargpt.yaml"
SCRIPT = REPO / "studies" / "chargpt" / "train.py"


def test_the_study_names_the_knobs_the_script_takes_in_its_words() -> None:
    spec = load(STUDY)
    assert spec.task.knobs_read() == (
        "lr",
        "scheduler",
        "batch_size",
        "accumulation_steps",
        "precision",
    )
    assert spec.task.written_as()["precision"]["bf16"] == "bfloat16"
    assert spec.target.minimize and spec.target.metric == "val_loss"


def test_a_trial_of_the_study_reaches_its_loss_read_from_the_script_s_lines() -> None:
    """A configuration such a study finds (cosine, a higher lr, micro-batch 16), run as a trial
    runs it: stopped at the first val loss line at or below the target."""
    spec = load(STUDY)
    config = TrialConfig.from_mapping(
        complete(
            {
                **DEFAULT_BASELINE,
                "lr": 0.0043,
                "scheduler": "cosine",
                "batch_size": 16,
                "precision": "fp32",
            }
        )
    )
    run_trial = command_trial(
        spec.task.command,
        cwd=spec.task.folder(spec.path),
        hang_after=300,
        metric_name="val_loss",
        patterns=dict(spec.task.patterns),
        written=spec.task.written_as(),
    )
    # room for a busy machine: about 9 s on 2 quiet cores
    limits = Limits(
        target=spec.target.value, max_epochs=1, max_seconds=240, eval_every=1, minimize=True
    )
    result = run_trial(config, limits=limits, device=torch.device("cpu"), seed=9)
    assert result.reached and result.best_metric <= spec.target.value
    # its step is the eval line's own: a multiple of the study's --eval_interval=50
    assert result.optimizer_steps and result.optimizer_steps % 50 == 0, result.optimizer_steps


def test_the_script_refuses_a_value_of_the_wrong_type_as_its_configurator_does() -> None:
    """Why booleans are written True/False: `--decay_lr=false` is text, not a bool."""
    ran = subprocess.run(
        [sys.executable, str(SCRIPT), "--decay_lr=false"], capture_output=True, text=True
    )
    assert ran.returncode == 1 and "decay_lr takes a bool, got 'false'" in ran.stderr
