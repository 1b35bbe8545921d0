"""The probe's choice shown faster at its own micro-batch is paired with the baseline's setting
again at the smallest micro-batch a trial trains, where it must not be slower."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autotune.probe import paired_check

REPO = Path(__file__).resolve().parents[2]


def test_a_choice_no_slower_at_the_trials_batch_is_kept_and_one_slower_there_is_not() -> None:
    speeds = {"chosen": [1.0], "baseline": [1.0]}
    # even, or a little slower inside the windows' spread: the lead at the probe's batch stands
    assert paired_check.no_slower([1.0, 0.98, 1.03], speeds)["kept"] == "chosen"
    assert paired_check.no_slower([0.97, 0.96, 0.99], speeds)["kept"] == "chosen"
    slower = paired_check.no_slower([0.5, 0.52, 0.49], speeds)
    assert slower["kept"] == "baseline" and slower["why"].startswith("slower than the baseline's")
    busy = paired_check.no_slower([1.0, 2.5, 0.9], speeds)
    assert busy["kept"] == "baseline" and busy["why"].startswith("too busy to tell")


def test_a_precision_faster_at_the_probe_s_batch_and_slower_at_the_trials_keeps_the_baseline_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 steps twice as fast as fp32 at the probe's 128 samples and four times slower at the 8 a
    trial may train (tests.tasks.paced_narrow_step): the trials keep fp32, and the report says
    why. However busy the machine, the baseline's precision is what stays (shown slower at 8, or
    too busy to tell)."""
    from autotune.probe import run
    from autotune.probe.model.outcome import restrict
    from autotune.probe.model.text import describe
    from autotune.spec import study_file
    from autotune.study import preparation

    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports
    path = tmp_path / "study.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": "tests.tasks:paced_narrow_step",
                "target": {"metric": "accuracy", "value": 0.5},
                "space": {
                    "lr": 0.05,
                    "scheduler": "constant",
                    "batch_size": [8, 128],
                    "accumulation_steps": 1,
                    "num_workers": 0,
                    "precision": ["fp32", "bf16"],
                    "fused_optimizer": False,
                },
                "baseline": {"lr": 0.05, "batch_size": 8},
                "probe": "joint",
                "budget": {"trials": 1, "max_epochs": 1, "max_seconds": 5},
                "confirm": {"top": 0},
            }
        )
    )
    spec = study_file.load(path)
    outcome = run.run(spec, preparation.prepare(spec))
    assert outcome["batch_size"] == 128
    assert outcome["precisions"] == ["fp32"] and outcome["chosen"]["precision"] == "fp32"
    assert restrict(preparation.prepare(spec).space, outcome)["precision"].values == ("fp32",)
    # no paired check where the end-to-end check already chose the baseline's setting
    paired = outcome.get("paired") or {"kept": "baseline"}
    assert paired["kept"] == "baseline"
    if "trials_batch" in paired:  # the choice held at the probe's batch: the trials' decided
        assert paired["trials_batch"]["batch_size"] == 8
        assert "at micro-batch 8, the smallest a trial trains" in paired["why"]
        said = describe(outcome)
        assert "The baseline's setting kept: the choice was" in said
        assert "micro-batch 8" in said
