"""Under goodput and systems_only, the table their trials are timed by is the probe's: its rates
measured apart, checked end to end at its batch and measured again at every micro-batch a trial
may train."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml

from autotune.probe import chosen_setting, plan, rates, throughput
from autotune.probe.model import goodput, roofline
from autotune.probe.model.figures import table_entries
from autotune.search.space import LOADER_KNOBS, Choices
from autotune.spec import study_file
from autotune.study import preparation
from autotune.train.config import TrialConfig
from tests.study.test_goodput import goodput_study
from tests.study.test_study import in_repo, load, run_cli  # noqa: F401 (in_repo: a fixture)

LOADER = {"data_on_device": False, "num_workers": 2, "prefetch_factor": 2, "pin_memory": False}
FORMATS = {
    "channels_last": False,
    "cudnn_benchmark": False,
    "tf32": False,
    "fused_optimizer": False,
}


def probed() -> dict:
    """A joint probe's outcome as stored: bf16 chosen at batch 128 (7,200/s end to end against
    8,000 predicted), measured again at 64 and out of memory at 512, fp32 kept beside it and
    measured at 64 and 128 (and checked end to end at 128), and a compile it kept."""
    chosen = roofline.Prediction(
        LOADER, {"precision": "bf16", **FORMATS}, loader_rate=10_000.0, compute_rate=8_000.0
    )
    at = roofline.at_batch
    return {
        "kind": "joint",
        "batch_size": 128,
        "chosen": {**chosen.figures(), "measured": 7_200.0, "checkpointing": False},
        "loader_rates": [{**LOADER, "samples_per_second": 10_000.0, "fixed_seconds": 0.3}],
        "compute_rates": [
            {"precision": "bf16", **FORMATS, "samples_per_second": 8_000.0, "fixed_seconds": 0.1}
        ],
        "batches": [
            {
                "batch_size": 64,
                "fixed_seconds": 0.5,
                **at(chosen, 7_200.0, loader_rate=9_000.0, compute_rate=6_000.0),
            },
            {"batch_size": 512, "oom": True, "reason": "out of memory"},
        ],
        "precision_batches": [
            {
                "precision": "fp32",
                "batch_size": batch,
                "fixed_seconds": 0.6,
                **at(chosen, 7_200.0, loader_rate=10_000.0, compute_rate=rate),
            }
            for batch, rate in ((64, 3_000.0), (128, 4_000.0))
        ],
        "compile": {"kept": True, "once_seconds": 20.0, "speed": 8_000.0, "faster": 10_000.0},
        # fp32 checked end to end at the chosen loader and formats
        "checked": [
            {**LOADER, "precision": "fp32", **FORMATS, "measured": 3_500.0, "start_up": 0.7}
        ],
    }


def test_the_table_times_each_batch_and_precision_as_the_probe_expects_it() -> None:
    table = goodput.Table.from_json({"entries": table_entries(probed()), "batch_norm": False})
    settings = {"precision": "bf16", **LOADER, **FORMATS, "compile": False, "checkpointing": False}
    # at its own batch what ran end to end, after its start-up measured apart (loader + step)
    assert table.speed_of({**settings, "batch_size": 128}) == goodput.Speed(
        7_200.0, pytest.approx(0.4)
    )
    # elsewhere its rates there, scaled as the end-to-end check found (0.9 of its prediction)
    assert table.speed_of({**settings, "batch_size": 64}) == goodput.Speed(
        pytest.approx(5_400.0), 0.5
    )
    # out of memory at 512: nothing from 512 up
    assert table.speed_of({**settings, "batch_size": 512}) is None
    assert table.largest_fitting() == {"bf16": 128, "fp32": 128}
    fp32 = {**settings, "precision": "fp32"}
    assert table.speed_of({**fp32, "batch_size": 64}).samples_per_second == pytest.approx(2_700.0)
    # at the probe's batch, what its own end-to-end check measured (its rates there said 3,600)
    assert table.speed_of({**fp32, "batch_size": 128}) == goodput.Speed(3_500.0, 0.7)
    # compiled at the probe's batch only: its compile once, then its step's gain at the loader
    compiled = table.speed_of({**settings, "compile": True, "batch_size": 128})
    assert compiled == goodput.Speed(pytest.approx(9_000.0), pytest.approx(20.4))
    assert table.speed_of({**settings, "compile": True, "batch_size": 64}) is None
    # a goodput trial's maths trains at the setting soonest for its samples: compiled only
    # where the run is long enough to win its compile back
    space = goodput_space()
    maths = {**settings, "lr": 0.1, "scheduler": "constant", "batch_size": 128}
    maths["accumulation_steps"] = 1
    few, _ = table.fastest(maths, space, samples=50_000)
    many, _ = table.fastest(maths, space, samples=2_000_000)
    assert (few["compile"], many["compile"]) == (False, True)
    # the loader and formats a goodput study fixes are the probe's (plan.restrict)
    restricted = plan.restrict(space, table).fixed()
    assert {k: restricted[k] for k in LOADER_KNOBS} == LOADER
    assert restricted["compile"] is False


def test_the_report_predicts_a_trial_at_each_precision_the_probe_kept() -> None:
    """A goodput trial at another precision than the chosen one is predicted from that
    precision's figures at its batch, as its table timed it, not left without a prediction."""
    from types import SimpleNamespace

    from autotune.report import winner

    outcome = probed()
    fp32 = {"precision": "fp32", **LOADER, **FORMATS, "compile": False, "checkpointing": False}
    # at 64, its rates there scaled as the chosen setting's check found: 2,700/s after 0.6 s
    assert winner.predicted_seconds(outcome, {**fp32, "batch_size": 64}, 2_700.0) == (
        pytest.approx(1.6)
    )
    # at the probe's batch, its own end-to-end check: 3,500/s after 0.7 s
    assert winner.predicted_seconds(outcome, {**fp32, "batch_size": 128}, 3_500.0) == (
        pytest.approx(1.7)
    )
    # compiled, at a batch it was not measured at, at another loader: nothing predicted
    assert (
        winner.predicted_seconds(outcome, {**fp32, "batch_size": 64, "compile": True}, 1.0) is None
    )
    assert winner.predicted_seconds(outcome, {**fp32, "batch_size": 512}, 1.0) is None
    other_loader = {**fp32, "batch_size": 64, "num_workers": 0}
    assert winner.predicted_seconds(outcome, other_loader, 1.0) is None
    best = SimpleNamespace(
        params={**fp32, "batch_size": 64}, samples_to_target=2_700.0, time_to_target=2.0
    )
    line = winner.prediction_line(outcome, best)
    assert line is not None and "the setting the probe chose, in fp32" in line
    assert "1.60 s for the winner's 2,700 samples" in line


def goodput_space():
    from autotune.search.space import Space

    values = {
        "batch_size": (64, 128, 512),
        "accumulation_steps": (1, 2),
        "precision": ("fp32", "bf16"),
        "data_on_device": (False,),
        "num_workers": (0, 2),
        "prefetch_factor": (2,),
        "pin_memory": (False,),
        **{k: (False,) for k in FORMATS},
        "compile": (False, True),
        "checkpointing": (False,),
    }
    return Space(domains=tuple((k, Choices(v)) for k, v in values.items()))


def test_the_table_keeps_what_the_probe_timed_and_the_trials_sample_only_what_it_times() -> None:
    """The table is the probe's figures as they are; a goodput study then samples only the
    precisions it times (else a trial's maths would have no setting), with the loader and formats
    fixed as the probe measured them. A probe that settled nothing gives no table."""
    table = plan.from_probe(probed(), batch_norm=True)
    assert table is not None and table["from_probe"] and "seconds" not in table
    assert table["table"]["batch_norm"] is True
    assert goodput.describe(table).startswith(
        "Trials timed from the probe's table: 5 of 6 systems settings measured"
    )
    unsettled = {**probed(), "chosen": None, "unsettled": "no setting ran end to end"}
    assert table_entries(unsettled) == [] and plan.from_probe(unsettled, batch_norm=False) is None
    # an earlier engine's outcome measured no table
    assert plan.from_probe({"loader": {}, "precisions": ["fp32"]}, batch_norm=False) is None
    space = goodput_space().replace("precision", Choices(("fp32", "bf16", "fp16")))
    only_bf16 = {**probed(), "precision_batches": []}
    restricted = plan.restrict(
        space,
        goodput.Table.from_json(plan.from_probe(only_bf16, batch_norm=False)["table"]),
    )
    assert restricted["precision"].values == ("bf16",)
    assert restricted.fixed()["checkpointing"] is False


def test_each_other_precision_is_measured_at_every_batch_beside_the_same_loader(
    tmp_path: Path,
) -> None:
    """The chosen setting's step at another precision, at each batch, in the one measurement of
    every step; the loader once a batch, whatever the precision."""
    from tests.probe.test_chosen_setting import SAMPLE, STEP, study

    spec = study_file.load(study(tmp_path))
    prepared = preparation.prepare(spec)
    calls = []

    def measured(work, *args):
        calls.append((work, sorted(args[0])))
        return prepared.measure(work, *args, device=torch.device("cpu"), seed=1)

    def config(setting: dict) -> TrialConfig:
        from autotune.search.space import complete

        return TrialConfig.from_mapping(complete({**prepared.baseline, **setting}))

    chosen = roofline.Prediction(
        LOADER, {"precision": "bf16", **FORMATS}, loader_rate=20_000.0, compute_rate=10_000.0
    )
    entries = chosen_setting.at_batches(
        measured, chosen, 9_000.0, [32], config, precisions={"fp32": [32, 128]}
    )
    assert calls == [
        (rates.measure_in_groups, ["32", "fp32@128", "fp32@32"]),
        (rates.measure_loaders_in_turn, ["128", "32"]),
        (throughput.measure_in_turn, ["32"]),  # the chosen setting's own, end to end
    ]
    own = [e for e in entries if "precision" not in e]
    fp32 = {e["batch_size"]: e for e in entries if e.get("precision") == "fp32"}
    assert [e["batch_size"] for e in own] == [32] and sorted(fp32) == [32, 128]
    assert own[0]["expected"] == own[0]["measured"] > 0
    for batch, entry in fp32.items():
        # the step at fp32 costs its full sample cost (bf16's is half)
        assert entry["compute_rate"] == pytest.approx(batch / (STEP + SAMPLE * batch), rel=0.25)
        # not run end to end: its prediction, scaled as the chosen setting's check found
        assert "measured" not in entry
        assert entry["expected"] == pytest.approx(entry["predicted"] * 0.9)
    assert own[0]["compute_rate"] > fp32[32]["compute_rate"]


def test_the_probe_space_under_systems_only_is_the_baselines_precision_and_splits(
    tmp_path: Path,
) -> None:
    path = goodput_study(
        tmp_path, "systems_only", baseline={"lr": 0.1, "batch_size": 32, "accumulation_steps": 2}
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(precision=["fp32", "bf16"], batch_size=[16, 32, 64, 128])
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = study_file.load(path)
    prepared = preparation.prepare(spec)
    space = plan.probe_space(spec, prepared.space, prepared.baseline, batch_norm=False)
    assert space["precision"].values == ("fp32",)
    assert space["batch_size"].values == (16, 32, 64)  # 128 does not split 64
    with_batch_norm = plan.probe_space(spec, prepared.space, prepared.baseline, batch_norm=True)
    assert with_batch_norm["batch_size"].values == (32,)
    other = dataclasses.replace(spec, objective="goodput")
    assert plan.probe_space(other, prepared.space, prepared.baseline, batch_norm=False) is (
        prepared.space
    )
