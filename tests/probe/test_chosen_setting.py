"""The joint probe measures the setting it chose at each of the space's micro-batches, so that a
trial at any of them has a predicted time: on the paced task with a cost a step, a smaller batch
computes slower a sample, and a real run at it takes what its prediction says: the setting as
measured end to end there."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.probe import rates, throughput
from autotune.probe import run as probe_run
from autotune.probe.model import roofline
from autotune.probe.model.text import batches_text, describe
from autotune.record.summary import BUSY_CORES
from autotune.report import winner
from autotune.search.space import complete
from autotune.spec import study_file
from autotune.study import preparation
from autotune.train import trial
from autotune.train.config import Limits, TrialConfig
from autotune.train.measure import other_load

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
# A run's time against its prediction from the probe's figures, on this shared 2-core machine:
# the same tolerance the roofline's own tests give a compute-bound setting whose loader shares
# the cores (tests/probe/test_roofline.py).
TOLERANCE = 0.3
STEP, SAMPLE = 6e-3, 0.1e-3  # tests.tasks:paced_per_step's compute costs


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports


def study(folder: Path) -> Path:
    path = folder / "batches.yaml"
    space = {
        "lr": 0.05,
        "scheduler": "constant",
        "batch_size": [32, 64, 128],
        "accumulation_steps": 1,
        "num_workers": [0, 2],
        "prefetch_factor": 2,
        "precision": ["fp32", "bf16"],
        "fused_optimizer": False,
    }
    path.write_text(
        yaml.safe_dump(
            {
                "task": "tests.tasks:paced_per_step",
                "target": {"metric": "accuracy", "value": 0.5},
                "space": space,
                "baseline": {"lr": 0.05, "batch_size": 32},
                "probe": "joint",
                "budget": {"trials": 1, "max_epochs": 1},
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def whole_study(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """One real study of one trial on the paced task with a cost a step, run as `autotune run`
    runs it: its probe's outcome as the probe returned it, and each measurement the probe asked
    for (what it measured, at which batches), read by the tests below."""
    from autotune.cli import main

    path = study(tmp_path_factory.mktemp("batches"))
    spec = yaml.safe_load(path.read_text())
    spec["budget"] = {"trials": 1, "max_epochs": 4, "eval_every": 0.25}
    spec["confirm"] = {"top": 0}
    # two loader workers alone: the baseline's setting (no workers) is none of the space's, so
    # no paired windows (tests/probe/test_paired_check.py, test_probe_trials_batch.py) precede
    # the measurements at the other batches read here
    spec["space"]["num_workers"] = 2
    path.write_text(yaml.safe_dump(spec))
    probed, calls = [], []
    run = probe_run.run

    def observed(spec, prepared, memo=None):
        """The probe as it runs, its measurements counted as they are asked for."""
        measure = prepared.measure

        def counted(work, *args, **kwargs):
            if work is not throughput.stop_rounds_at:  # the probe's time cap, set where it measures
                calls.append((work, sorted(c.batch_size for c in args[0].values())))
            return measure(work, *args, **kwargs)

        outcome = run(spec, dataclasses.replace(prepared, measure=counted), memo)
        probed.append(outcome)
        return outcome

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        patch.setattr(probe_run, "run", observed)
        assert main(["run", str(path), "--quiet"]) == 0
    [outcome] = probed
    return types.SimpleNamespace(path=path, outcome=outcome, calls=calls)


def test_the_chosen_setting_at_every_batch_predicts_a_run_there(
    whole_study: types.SimpleNamespace,
) -> None:
    spec = study_file.load(whole_study.path)
    prepared = preparation.prepare(spec)
    outcome, calls = whole_study.outcome, whole_study.calls
    chosen = outcome["chosen"]
    assert outcome["batch_size"] == 128 and chosen["measured"]
    # each other batch once: its step's rate, then its loader's, then the two together, one
    # batch at a time
    assert calls[-3:] == [
        (rates.measure_in_groups, [32, 64]),
        (rates.measure_loaders_in_turn, [32, 64]),
        (throughput.measure_in_turn, [32, 64]),
    ]
    assert outcome["phase_seconds"]["batches"] > 0
    at = {e["batch_size"]: e for e in outcome["batches"]}
    assert sorted(at) == [32, 64]
    narrow = 0.5 if chosen["precision"] == "bf16" else 1.0
    # The figures follow the set costs where the machine was quiet as the probe measured; other
    # processes on the cores slow every step beyond them (tests run beside other jobs).
    quiet = (outcome.get("other_cores") or 0) < BUSY_CORES
    for batch, entry in at.items():
        # the step's rate follows its costs: a step's cost spread over fewer samples (they are
        # waits, which no load shortens)
        costs = batch / (STEP + SAMPLE * narrow * batch)
        assert 0 < entry["compute_rate"] <= 1.1 * costs
        if quiet:
            assert entry["compute_rate"] == pytest.approx(costs, rel=0.25)
        # what a trial there is expected to train: the setting measured end to end there
        assert entry["measured"] > 0 and entry["expected"] == entry["measured"]
        assert entry["fixed_seconds"] > 0 and entry["oom"] is False
    if quiet:  # a larger batch spreads the step's cost over more samples
        assert at[32]["expected"] < at[64]["expected"] < chosen["measured"]
    text = describe(outcome)
    assert "The chosen setting by micro-batch (" in text
    assert (
        f"32: {at[32]['measured']:,.0f}/s end to end ({at[32]['predicted']:,.0f}/s predicted, "
        f"{at[32]['bottleneck']}-bound)"
    ) in text
    assert f"128: {chosen['measured']:,.0f}/s end to end" in text

    # A real run of the chosen setting at the smallest and the probe's batch, one epoch each, the
    # target out of reach: its training time beside what the figures predict for its samples.
    limits = Limits(target=1.01, max_epochs=1, max_seconds=60, eval_every=1)
    setting = {k: chosen[k] for k in (*roofline.MEASURED_FORMATS, "precision") if k in chosen}
    setting.update({k: chosen[k] for k in ("num_workers", "prefetch_factor", "pin_memory")})
    assert prepared.task is not None
    samples = len(prepared.task.train)
    for batch in (32, 128):
        params = {**prepared.baseline, **setting, "batch_size": batch}
        config = TrialConfig.from_mapping(complete(params))
        with other_load() as load:
            result = trial.run(prepared.task, config, limits=limits, device=CPU, seed=5)
        predicted = winner.predicted_seconds(outcome, params, samples)
        assert predicted is not None and result.train_seconds > 0
        if quiet and (load.cores or 0) < BUSY_CORES:  # else the load's time, not the task's
            assert result.train_seconds == pytest.approx(predicted, rel=TOLERANCE), batch
        best = types.SimpleNamespace(
            params=params, samples_to_target=samples, time_to_target=result.train_seconds
        )
        line = winner.prediction_line(outcome, best)
        assert line is not None and f"at batch {batch}, measured end to end" in line
    # an outcome stored before the other batches were measured end to end: their rates there,
    # scaled as the check at the probe's batch found its prediction
    scale = chosen["measured"] / chosen["predicted"]
    unmeasured = [{k: v for k, v in e.items() if k != "measured"} for e in outcome["batches"]]
    for e in unmeasured:
        e["expected"] = e["predicted"] * scale
    older = {**outcome, "batches": unmeasured}
    params = {**prepared.baseline, **setting, "batch_size": 32}
    expected = winner.expected_rate(older, params)
    assert expected is not None and expected["scaled"]
    assert expected["rate"] == pytest.approx(at[32]["predicted"] * scale)
    best = types.SimpleNamespace(params=params, samples_to_target=samples, time_to_target=1.0)
    assert "scaled as the end-to-end check at batch 128 found" in winner.prediction_line(
        older, best
    )
    assert f"32: {at[32]['predicted'] * scale:,.0f}/s" in describe(older)
    params = {**params, "batch_size": 128}
    # a batch the probe did not measure predicts nothing; another setting, what the end-to-end
    # check measured of it where it was checked, at the probe's batch
    assert winner.predicted_seconds(outcome, {**params, "batch_size": 96}, samples) is None
    other = {**params, "precision": "fp32" if chosen["precision"] == "bf16" else "bf16"}
    checked = [
        c
        for c in outcome["checked"]
        if c["measured"]  # one outrun before its turn has no figure to predict from
        if all(c[k] == other[k] for k in ("num_workers", "pin_memory", "precision"))
    ]
    assert winner.predicted_seconds(outcome, other, samples) == (
        pytest.approx(checked[0]["start_up"] + samples / checked[0]["measured"])
        if checked
        else None
    )
    unchecked = {**other, "num_workers": 3}
    assert winner.predicted_seconds(outcome, unchecked, samples) is None


def test_a_batch_out_of_memory_at_the_chosen_setting_is_said_and_predicts_nothing() -> None:
    chosen = roofline.Prediction(
        {"num_workers": 2, "prefetch_factor": 2, "pin_memory": False},
        {"precision": "bf16", "channels_last": False, "cudnn_benchmark": False},
        loader_rate=10_000.0,
        compute_rate=8_000.0,
    )
    outcome = {
        "batch_size": 128,
        "chosen": {**chosen.figures(), "measured": 7_200.0, "checkpointing": False},
        "loader_rates": [],
        # the device's peaks where measured (CUDA): the chosen step's at the probe's batch
        "compute_rates": [
            {"precision": "fp32", "channels_last": False, "peak_memory_bytes": 9 * 2**30},
            {**chosen.compute, "peak_memory_bytes": 3 * 2**30},
        ],
        "batches": [
            {
                "batch_size": 64,
                "peak_memory_bytes": 1.6 * 2**30,
                "fixed_seconds": 0.5,
                **roofline.at_batch(chosen, 7_200.0, loader_rate=9_000.0, compute_rate=6_000.0),
            },
            {"batch_size": 512, "oom": True, "reason": "out of memory", "peak_memory_bytes": None},
        ],
    }
    at_64 = outcome["batches"][0]
    assert at_64["predicted"] == 6_000.0 and at_64["expected"] == pytest.approx(5_400.0)
    assert at_64["bottleneck"] == "compute"
    text = batches_text(outcome)
    assert text.endswith(
        "64: 5,400/s compute-bound, 1.6 GiB at peak, 128: 7,200/s end to end, 3.0 GiB at peak, "
        "512: out of memory"
    )
    # where the chosen setting keeps the training set on the device, its copy (as the gather's
    # measurement held it) is in every peak
    on_device = {
        **outcome,
        "chosen": {**outcome["chosen"], "data_on_device": True},
        "loader_rates": [{"data_on_device": True, "peak_memory_bytes": 2**30}],
    }
    assert batches_text(on_device).endswith(
        "64: 5,400/s compute-bound, 2.6 GiB at peak, 128: 7,200/s end to end, 4.0 GiB at peak, "
        "512: out of memory"
    )
    params = {**chosen.setting, "batch_size": 64}
    assert winner.predicted_seconds(outcome, params, 5_400.0) == pytest.approx(1.5)
    assert winner.predicted_seconds(outcome, {**params, "batch_size": 512}, 5_400.0) is None
    # the report's trial table: each trial's prediction for the samples its run needed
    records = [
        {**params, "number": 3, "samples_to_target": 5_400},
        {**params, "number": 4, "samples_to_target": float("nan")},  # not counted
        {**params, "number": 5, "samples_to_target": 5_400, "precision": "fp32"},
    ]
    assert winner.predicted_column(outcome, records) == [pytest.approx(1.5), None, None]
    assert winner.predicted_column(outcome, records[1:]) is None
    # a time that is a mean over runs is not set beside its first run's samples
    assert winner.predicted_column(outcome, [{**records[0], "runs": 3}]) is None
    # the probe measured without checkpointing: a run that recomputes is not predicted by it
    assert winner.predicted_seconds(outcome, {**params, "checkpointing": True}, 5_400.0) is None
    # whole schedules are no times to the target: no prediction beside them
    whole = types.SimpleNamespace(fixed_schedule=True, probe=outcome)
    assert winner.timing(whole) is None
    assert winner.timing(types.SimpleNamespace(fixed_schedule=False, probe=outcome)) is outcome
    # a compiled run: its compile once and its step's gain, as weighed at the probe's batch only
    outcome["compile"] = {"once_seconds": 20.0, "speed": 7_200.0, "faster": 9_000.0}
    compiled = {**params, "batch_size": 128, "compile": True}
    assert winner.predicted_seconds(outcome, compiled, 9_000.0) == pytest.approx(21.0)
    assert winner.predicted_seconds(outcome, {**compiled, "batch_size": 64}, 9_000.0) is None


def test_a_crash_at_another_batch_leaves_the_choice_and_says_why(tmp_path: Path) -> None:
    """A process that dies only at a smaller batch than the probe's (a real exit, in the child
    process the measurement runs in): the choice stands, that batch has no prediction, and the
    report says why."""
    path = study(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["task"] = "tests.tasks:exits_at_small_batches"
    spec["space"]["batch_size"] = [32, 128]
    spec["isolation"] = "process"
    path.write_text(yaml.safe_dump(spec))
    loaded = study_file.load(path)
    outcome = probe_run.run(loaded, preparation.prepare(loaded))
    assert outcome["chosen"] is not None and outcome["chosen"]["measured"]
    [entry] = outcome["batches"]
    assert entry["batch_size"] == 32 and "expected" not in entry
    assert entry["reason"].startswith("a measurement failed: ")
    assert "32: no figure (a measurement failed: " in describe(outcome)
    # paired with the baseline's setting at 32 (the smallest a trial trains), the same crash:
    # the task's, whatever the setting, so the choice stands
    paired = outcome.get("paired") or {}
    if "trials_batch" in paired:
        assert paired["kept"] == "chosen"
        assert paired["trials_batch"]["why"].startswith("a measurement failed there: ")
        assert "32, the smallest a trial trains, not weighed" in describe(outcome)
    params = {**{k: outcome["chosen"][k] for k in ("num_workers", "precision")}, "batch_size": 32}
    assert winner.predicted_seconds(outcome, params, 1000.0) is None


def test_the_report_sets_each_trial_beside_its_predicted_time(
    whole_study: types.SimpleNamespace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole study: its trials at the chosen setting each get the time the probe's figures
    predict for the samples they needed, in the text report and the HTML page, and the winner's
    line says what it was predicted from."""
    from autotune.cli import main

    path = whole_study.path
    capsys.readouterr()
    assert main(["report", str(path), "--html", str(tmp_path / "page.html")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("Fastest trials"))) + 1
    columns = lines[header].split()
    assert columns[:3] == ["trial", "seconds", "predicted"]
    row = lines[header + 1].split()
    seconds, predicted = float(row[1]), float(row[2])
    assert predicted > 0 and seconds > 0
    # the run beside its prediction where neither the probe nor the run shared the cores with
    # other processes: their load slows each by its own share
    study = optuna.load_study(study_name=path.stem, storage=f"sqlite:///{path.with_suffix('.db')}")
    ran = study.trials[int(row[0])].user_attrs.get("other_load") or {}
    probed = study.user_attrs["probe"]
    if max(probed.get("other_cores") or 0, ran.get("other_cores") or 0) < BUSY_CORES:
        assert predicted == pytest.approx(seconds, rel=TOLERANCE)
    assert "Predicted at the setting the probe chose (" in out
    assert "<th>predicted</th>" in (tmp_path / "page.html").read_text()
