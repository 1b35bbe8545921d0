"""A study whose trials each train on several devices (`devices_per_trial`): a real one on two
CPU processes (gloo) reaches its target with its trials stored as usual; what cannot train on
several devices, or a machine with too few, is refused before the study starts; the stored
definition holds the count, so changing it on a resumed study is a change like any other."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.errors import SpecError
from autotune.record import definition, schema
from autotune.spec.study_file import load as load_spec
from autotune.study import preparation
from tests.study.test_study import finished, load, run_cli, write_study


def on_devices(path: Path, devices: int = 2, **more: object) -> Path:
    raw = yaml.safe_load(path.read_text())
    raw.update(devices_per_trial=devices, **more)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_study_on_two_devices_reaches_its_target_and_stores_its_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = on_devices(write_study(tmp_path, trials=2, batch_sizes=(16, 32)))
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    assert code == 0 and "Winner: " in out
    trials = finished(load(path))
    assert len(trials) == 2
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(t.user_attrs["result"]["reached"] for t in complete)
    # the epochs count both ranks' samples: the run stopped at an evaluation, every half epoch
    assert all(t.user_attrs["result"]["epochs"] % 0.5 == 0 for t in complete)

    code, out, _ = run_cli("report", str(path), capsys=capsys)
    assert code == 0 and "Each trial trained on 2 devices" in out
    code, out, _ = run_cli("report", str(path), "--json", capsys=capsys)
    assert json.loads(out)["devices_per_trial"] == 2


DDP_SPACE = {
    "ddp_bucket_cap_mb": [1, 50],
    "ddp_gradient_as_bucket_view": [False, True],
    "ddp_static_graph": True,
}


def with_space(path: Path, **domains: object) -> Path:
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(domains)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_study_on_two_devices_searches_ddp_s_knobs_and_stores_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # first trials sampled: the prior's, at the baseline's only batch, train nearly the baseline's
    # maths, and a baseline that wins its confirmation exports its own DDP knobs, not the space's
    study = on_devices(write_study(tmp_path, trials=3, batch_sizes=(16,)), first_trial="sampled")
    path = with_space(study, **DDP_SPACE)
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    assert code == 0 and "Winner: " in out
    trials = finished(load(path))
    assert len(trials) == 3
    for trial in trials:
        config = schema.trained_config(trial)
        assert config["ddp_bucket_cap_mb"] in (1, 50) and config["ddp_static_graph"] is True
        assert config["ddp_gradient_as_bucket_view"] in (False, True)
        # sampled where the space leaves a choice, as Optuna parameters
        assert {"ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view"} <= set(trial.params)
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert trial.user_attrs["result"]["reached"]
    # the winner's DDP knobs, as trained: a trial's, or the baseline's where no trial's lead over
    # it was resolved on fresh seeds
    code, out, _ = run_cli("report", str(path), "--json", capsys=capsys)
    best = json.loads(out)["best"]["params"]
    code, out, _ = run_cli("export", str(path), "--format", "yaml", capsys=capsys)
    exported = yaml.safe_load(out)
    assert code == 0 and exported["ddp_static_graph"] is best["ddp_static_graph"]
    assert exported["ddp_bucket_cap_mb"] == best["ddp_bucket_cap_mb"]
    # the report shows them (on one device it leaves them out: DDP never ran)
    code, out, _ = run_cli("report", str(path), capsys=capsys)
    assert code == 0 and "bucket_mb" in out
    assert f"  ddp_static_graph: {best['ddp_static_graph']}" in out


def test_on_one_device_ddp_s_knobs_are_fixed_to_its_defaults_with_one_notice(
    tmp_path: Path,
) -> None:
    path = with_space(write_study(tmp_path), **{**DDP_SPACE, "ddp_bucket_cap_mb": [25, 50]})
    with pytest.raises(SpecError) as refused:  # static_graph fixed true: it would change nothing
        preparation.prepare(load_spec(path))
    assert refused.value.key == "space.ddp_static_graph" and refused.value.value == [True]
    assert "leave ddp_static_graph out" in str(refused.value)

    path = with_space(path, ddp_static_graph=[True, False])
    prepared = preparation.prepare(load_spec(path))
    assert prepared.space.fixed()["ddp_bucket_cap_mb"] == 25
    assert prepared.space.fixed()["ddp_gradient_as_bucket_view"] is False
    assert prepared.space.fixed()["ddp_static_graph"] is False
    [notice] = [n for n in prepared.notices if "ddp_" in n]
    assert notice == (
        "ddp_bucket_cap_mb to 25, ddp_gradient_as_bucket_view to false, ddp_static_graph to false "
        "fixed: DistributedDataParallel's settings apply only with devices_per_trial > 1"
    )


def test_the_stored_definition_holds_the_devices_so_a_change_is_refused(tmp_path: Path) -> None:
    one = load_spec(write_study(tmp_path))
    two = load_spec(on_devices(write_study(tmp_path)))
    space = one.space
    stored = definition.for_spec(two, space=space, device="cpu")
    assert stored["devices_per_trial"] == 2
    # one device, the default, leaves the key out: studies stored before it still match
    assert "devices_per_trial" not in definition.for_spec(one, space=space, device="cpu")
    current = definition.for_spec(one, space=space, device="cpu")
    assert definition.changes(stored, current) == ["devices_per_trial: 2 -> 1"]


def test_goodput_is_refused_on_several_devices_and_the_probe_is_off_with_one_notice(
    tmp_path: Path,
) -> None:
    """The probe measures one device: goodput, whose trials are timed from its table, is refused;
    otherwise the probe does not run, and one notice says so."""
    spec = load_spec(on_devices(write_study(tmp_path), objective="goodput"))
    with pytest.raises(SpecError) as refused:
        preparation.prepare(spec)
    assert refused.value.key == "devices_per_trial" and refused.value.value == 2
    assert "1 with objective: goodput, whose trials are timed from the probe's table" in str(
        refused.value
    )
    prepared = preparation.prepare(load_spec(on_devices(write_study(tmp_path), probe="joint")))
    assert prepared.measure is None  # nothing for the probe to measure with
    [notice] = [n for n in prepared.notices if "probe" in n]
    assert notice.startswith("the systems probe measures one device, so it does not run")


def test_a_command_task_on_several_devices_runs_under_the_launcher(tmp_path: Path) -> None:
    """Its trials run the command under torch.distributed's launcher (tests/runners/
    test_command_devices.py trains one), in a process of its own whatever isolation says."""
    (tmp_path / "train.py").write_text("")
    path = on_devices(write_study(tmp_path), task={"command": "python train.py"})
    prepared = preparation.prepare(load_spec(path))
    assert prepared.isolation == "process" and prepared.task is None
    assert not [n for n in prepared.notices if "does not apply" in n]


def test_more_devices_than_the_machine_has_cuda_devices_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a machine with one CUDA device (as torch sees it), before any training or storage."""
    spec = load_spec(on_devices(write_study(tmp_path), devices=2, device="cuda"))
    monkeypatch.setattr(preparation, "resolve_device", lambda spec: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SpecError) as refused:
        preparation.prepare(spec)
    assert str(refused.value) == (
        f"{spec.path}: devices_per_trial: got 2; at most 1 on cuda: a trial takes one CUDA "
        "device per process (cuda:0 to cuda:1), and this machine has 1 CUDA device"
    )
    assert not (tmp_path / "study.db").exists()
