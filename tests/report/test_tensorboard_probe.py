"""`autotune report --tensorboard DIR` writes the systems probe's measurements under DIR/probe:
each measured setting a run with its figures, and a text summary; read back here with
tensorboard's own reader, from studies the joint probe measured and one an earlier engine stored."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune.cli import main
from autotune.probe.model import screening
from autotune.record import schema
from autotune.search.space import FORMAT_KNOBS, LOADER_KNOBS

REPO = Path(__file__).resolve().parents[2]
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard is in the test extra: bash scripts/test.sh installs it",
)


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports


def probed(folder: Path, probe: str) -> tuple[Path, dict]:
    """A one-trial study whose probe chooses among two loader settings and two precisions, its
    TensorBoard folder and its stored probe outcome."""
    study = {
        "task": "tests.tasks:blobs",
        "target": {"metric": "accuracy", "value": 0.9},
        "space": {
            "lr": 0.1,
            "batch_size": [16, 32],
            "num_workers": [0, 1],
            "prefetch_factor": 2,
            "precision": ["fp32", "bf16"],
        },
        "probe": probe,
        "budget": {"trials": 1, "max_epochs": 1, "max_seconds": 10, "eval_every": 0.5},
        "confirm": {"top": 0},
        "isolation": "none",
    }
    path = folder / f"{probe}.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["run", str(path), "--quiet"]) == 0
    assert main(["report", str(path), "--tensorboard", str(folder / "tb")]) == 0
    stored = optuna.load_study(study_name=probe, storage=f"sqlite:///{path.with_suffix('.db')}")
    return folder / "tb" / "probe", schema.probe(stored.user_attrs)


def read(run: Path) -> event_accumulator.EventAccumulator:
    accumulator = event_accumulator.EventAccumulator(str(run))
    accumulator.Reload()
    return accumulator


def figures(folder: Path, tag: str) -> dict[str, list[tuple[int, float]]]:
    """Each run under `folder` that has `tag` -> its (step, value) points of it."""
    runs = {run.name: read(run) for run in folder.iterdir()}
    return {
        name: [(e.step, e.value) for e in run.Scalars(tag)]
        for name, run in runs.items()
        if tag in run.Tags()["scalars"]
    }


def summary(folder: Path) -> str:
    return read(folder).Tensors("probe/summary")[0].tensor_proto.string_val[0].decode()


@pytest.mark.parametrize("outpaced", [False, True])
def test_the_joint_probe_s_rates_and_checks_read_back_one_run_per_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outpaced: bool
) -> None:
    # whether the gather outpaces the step depends on the machine: each way, set by its threshold
    monkeypatch.setattr(screening, "GATHER_OUTPACES", 1e-9 if outpaced else 1e9)
    folder, outcome = probed(tmp_path, "joint")
    assert ("gather_outpaced" in outcome) == outpaced
    # a loader setting left unmeasured (one before it already outpaced the step) has no figure
    loader_rates = [r["samples_per_second"] for r in outcome["loader_rates"]]
    loader_rates = [rate for rate in loader_rates if rate]
    loaders = figures(folder / "loader", "probe/loader_rate")
    assert set(loaders) <= {
        "num_workers=0",
        "num_workers=1,prefetch_factor=2",
        "data_on_device,num_workers=0",
    }
    # the set on the device is measured first; the DataLoaders only where its gather did not
    # outpace the step
    assert "data_on_device,num_workers=0" in loaders and len(loaders) == len(loader_rates)
    assert ("num_workers=0" in loaders) == (not outpaced)
    assert sorted(v for [(step, v)] in loaders.values() if step == 0) == pytest.approx(
        sorted(loader_rates), rel=1e-6
    )
    computes = figures(folder / "compute", "probe/compute_rate")
    # each precision and format, at each thread count the loader settings leave the step
    assert len(computes) == len(outcome["compute_rates"]) > 2
    assert sorted(v for [(_, v)] in computes.values()) == pytest.approx(
        sorted(r["samples_per_second"] for r in outcome["compute_rates"]), rel=1e-6
    )
    assert any(name.startswith("precision=bf16") for name in computes)
    predicted = figures(folder / "end_to_end", "probe/end_to_end_predicted")
    measured = figures(folder / "end_to_end", "probe/end_to_end_measured")
    # a setting left unmeasured (one measured before it outran it) has its prediction alone
    ran = [c for c in outcome["checked"] if c["measured"]]
    assert len(predicted) == len(outcome["checked"]) and set(measured) <= set(predicted)
    assert len(measured) == len(ran) >= 1
    # a run is named by its setting's knobs alone, not by its figures (its start-up, say)
    knobs = {*LOADER_KNOBS, "precision", *FORMAT_KNOBS}
    assert all({part.split("=")[0] for part in name.split(",")} <= knobs for name in predicted)
    assert sorted(v for [(_, v)] in predicted.values()) == pytest.approx(
        sorted(c["predicted"] for c in outcome["checked"]), rel=1e-6
    )
    assert sorted(v for [(_, v)] in measured.values()) == pytest.approx(
        sorted(c["measured"] for c in ran), rel=1e-6
    )
    # the chosen setting at each micro-batch, its batch the step: at the probe's own, as measured
    # end to end
    chosen = outcome["chosen"]
    [(smaller, elsewhere)] = [(e["batch_size"], e["expected"]) for e in outcome["batches"]]
    batches = read(folder / "batches")
    expected = batches.Scalars("probe/batch_expected")
    assert [e.step for e in expected] == [smaller, 32]
    assert [e.value for e in expected] == pytest.approx([elsewhere, chosen["measured"]], rel=1e-6)
    steps = batches.Scalars("probe/batch_compute_rate")
    assert steps[1].value == pytest.approx(chosen["compute_rate"], rel=1e-6)
    text = summary(folder)
    assert text.startswith(f"Joint systems probe (batch 32: {len(loader_rates)} loader and ")
    assert "| num_workers | prefetch_factor | pin_memory | samples/s |" in text
    assert "| predicted | measured | note |" in text
    assert (
        "| batch_size | loader rate | compute rate | predicted | measured | expected | bottleneck "
        "| note |" in text
    )


def test_a_study_stored_by_the_earlier_engine_writes_its_runs_in_the_order_they_ran(
    tmp_path: Path,
) -> None:
    """A probe stored by the earlier engine (short runs, one knob at a time) still reads back."""
    from autotune.report import tensorboard_probe
    from tests.probe.model.test_outcome import STORED

    assert tensorboard_probe.write(tmp_path, STORED, protected=[]) == 4
    seconds = figures(tmp_path / "probe" / "runs", "probe/run_seconds")
    points = sorted(point for run in seconds.values() for point in run)
    # the run that never finished has no figure; the others at their place in the order
    assert [step for step, _ in points] == [1, 2, 3]
    assert [value for _, value in points] == pytest.approx([1.0, 0.8, 0.7], rel=1e-6)
    assert "num_workers=1,prefetch_factor=2" in seconds
    text = summary(tmp_path / "probe")
    assert text.startswith("Systems probe (4 short runs at batch 128")
    assert "| run | num_workers | prefetch_factor | pin_memory | seconds |" in text
