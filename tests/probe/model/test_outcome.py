"""The probe's shared rules: what it chooses among, and a study stored by the earlier engine (short
runs, one knob at a time), which still narrows its space and reads in the report."""

from __future__ import annotations

from pathlib import Path

from autotune.probe.model import outcome
from autotune.search.space import Choices, Space
from autotune.spec.study_file import from_mapping

BASELINE = {
    "lr": 0.01,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "num_workers": 0,
    "prefetch_factor": None,
    "pin_memory": False,
    "precision": "fp32",
}
# As the earlier engine stored it: one worker with prefetch 4 fastest, bf16 removed at 0.91x.
STORED = {
    "loader": {"num_workers": 1, "prefetch_factor": 4, "pin_memory": False},
    "precisions": ["fp32"],
    "speed": {"fp32": 1.0, "bf16": 1 / 1.1},
    "probed_loader": True,
    "batch_size": 128,
    "runs": [
        {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "seconds": 1.0},
        {"num_workers": 1, "prefetch_factor": 2, "pin_memory": False, "seconds": 0.8},
        {"num_workers": 1, "prefetch_factor": 4, "pin_memory": False, "seconds": 0.7},
        {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False, "seconds": float("inf")},
    ],
    "seconds": 2.5,
}


def space(**domains) -> Space:
    raw = {
        "data_on_device": False,
        "num_workers": [0, 1],
        "prefetch_factor": [2, 4],
        "pin_memory": False,
        "precision": ["fp32", "bf16"],
        **domains,
    }
    return from_mapping(
        {"task": "digits", "target": {"metric": "accuracy", "value": 0.9}, "space": raw},
        path=Path("probe.yaml"),
    ).space


def test_a_study_stored_by_the_earlier_engine_narrows_its_space_and_reports() -> None:
    restricted = outcome.restrict(space(num_workers=[0, 1, 2]), STORED)
    # stored before data_on_device was a knob: its loader had a DataLoader
    assert restricted["data_on_device"] == Choices((False,))
    assert restricted["num_workers"] == Choices((1,))
    assert restricted["prefetch_factor"] == Choices((4,))
    assert restricted["precision"] == Choices(("fp32",)) and restricted["lr"] == space()["lr"]
    line = outcome.describe(STORED)
    assert line.startswith("Systems probe (4 short runs at batch 128, 2.5 s of training)")
    assert "num_workers 1, prefetch_factor 4" in line
    assert "bf16 removed (0.91x the speed of fp32)" in line
    assert "num_workers 2, prefetch_factor 2, pin_memory false: no run finished" in line
    assert "busy" not in line  # no load recorded (a study from before it was measured)
    assert "busy" not in outcome.describe({**STORED, "other_cores": 0.1, "cores": 2})  # quiet
    assert "other processes kept 1.0 of 2 cores busy meanwhile" in outcome.describe(
        {**STORED, "other_cores": 1.0, "cores": 2}
    )


def test_what_is_worth_probing() -> None:
    assert outcome.worth_probing(space())
    assert not outcome.worth_probing(space(num_workers=0, precision="fp32"))
    assert len(
        outcome.loader_settings(space(num_workers={"low": 0, "high": 2}, pin_memory=[False, True]))
    ) == 2 * (1 + 2 + 2)
    on_device = outcome.loader_settings(space(data_on_device=[False, True], num_workers=0))
    assert on_device[-1] == {
        "data_on_device": True,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    assert not outcome.worth_probing(
        space(num_workers={"low": 0, "high": 16}, prefetch_factor=[2, 4, 8], precision="fp32")
    )
