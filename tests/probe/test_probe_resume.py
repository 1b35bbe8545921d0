"""A joint probe cut short goes on where it stopped: each measurement is kept in the study as it
ends, and the same command, run again, takes those instead of measuring them again."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.cli import main
from autotune.probe import rates, throughput
from autotune.probe.memo import Memo, _digest
from autotune.probe.model import roofline
from autotune.probe.rates import Rate
from autotune.probe.run import _Probing, _weigh_compile
from autotune.record import schema
from autotune.search.space import Choices
from autotune.spec import study_file
from autotune.study import preparation
from tests.probe.test_roofline import load, write_study

REPO = Path(__file__).resolve().parents[2]


def autotune(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args, "--quiet"],
        cwd=REPO,  # so that `tests.tasks:...` imports
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its loader workers die with it
    )


def kept_so_far(path: Path) -> dict:
    try:
        return schema.probe_so_far(load(path).user_attrs)
    except (KeyError, optuna.exceptions.StorageInternalError):  # not yet created
        return {}


def stopped(path: Path, how: signal.Signals, status: int, *, once_kept: int) -> dict:
    """Run the study, stop it with `how` once its probe has kept more than `once_kept`
    measurements, and return what the study kept."""
    run = autotune("run", str(path))
    deadline = time.monotonic() + 120
    while len(kept_so_far(path)) <= once_kept:
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no more than {once_kept} kept within 120 s"
        time.sleep(0.1)
    os.killpg(run.pid, how)  # mid-probe: the measurement under way is lost, not those before
    _, err = run.communicate(timeout=60)
    assert run.returncode == status and "Traceback" not in err, err[-3000:]
    assert schema.probe(load(path).user_attrs) is None  # the probe did not finish
    return kept_so_far(path)


def test_a_probe_stopped_twice_midway_keeps_what_it_measured_and_the_last_run_goes_on_from_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_study(tmp_path, probe="joint")
    study_file = yaml.safe_load(path.read_text())
    # fewer settings to measure: one precision (what is kept and taken again is the point, not
    # the choice), two worker counts so that paired windows still follow the end-to-end check
    study_file["space"].update(batch_size=128, num_workers=[0, 2], precision="fp32")
    path.write_text(yaml.safe_dump(study_file))
    # Ctrl-C to the whole group, then a kill -9 once the next run kept one more
    after_ctrl_c = stopped(path, signal.SIGINT, 130, once_kept=0)
    after_kill = stopped(path, signal.SIGKILL, -signal.SIGKILL, once_kept=len(after_ctrl_c))
    assert after_kill.items() >= after_ctrl_c.items()  # what the first run kept, kept as it was
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    said = f"Measurements cut short: {len(after_kill)} measurements kept in the study"
    assert said in capsys.readouterr().out
    assert main(["report", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measurements_kept"] == len(after_kill)

    # the last run needs no process of its own: nothing stops it
    assert main(["run", str(path), "--quiet"]) == 0
    attrs = load(path).user_attrs
    outcome = schema.probe(attrs)
    assert outcome["chosen"] is not None
    assert outcome["kept_measurements"] == len(after_kill) > len(after_ctrl_c) >= 1
    # the first kept (the compute rates) are what the probe's figures hold, to the last digit
    figures = {r["samples_per_second"] for r in outcome["compute_rates"]}
    first = {v["samples_per_second"] for e in after_ctrl_c.values() for v in e["values"].values()}
    assert first and first <= figures
    # its time counts what the runs cut short measured for it, once
    assert outcome["seconds"] >= sum(e["seconds"] for e in after_kill.values()) > 0
    assert schema.probe_so_far(attrs) == {}  # kept until the outcome was stored
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{len(after_kill)} measurements kept from a run cut short" in out
    assert "Measurements cut short" not in out  # nothing is left to go on from


def test_a_confirmation_killed_midway_keeps_its_runs_and_the_next_run_measures_only_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "study.yaml"
    study_file = {
        "task": "tests.hostile.tasks:slow",  # 20 ms a step: a confirmation run takes a second
        "target": {"metric": "accuracy", "value": 0.5},
        "space": {"lr": {"low": 0.05, "high": 0.5, "log": True}, "batch_size": [32, 64]},
        "probe": "none",
        "budget": {"trials": 1, "max_epochs": 2},
        "confirm": {"top": 1, "runs": 4},
    }
    path.write_text(yaml.safe_dump(study_file))
    run = autotune("run", str(path))
    deadline = time.monotonic() + 120
    while len(kept_so_far(path)) < 2:
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no 2 confirmation runs kept within 120 s"
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    kept = kept_so_far(path)
    assert schema.confirmation(load(path).user_attrs) is None  # it did not finish
    assert {e["kind"] for e in kept.values()} == {"plain"}

    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    attrs = load(path).user_attrs
    outcome = schema.confirmation(attrs)
    assert outcome["kept_measurements"] == len(kept)
    # the kept runs are in the outcome as they were measured, to the last digit; the rest are new
    assert all(e["values"] in outcome["runs"] for e in kept.values())
    assert len(outcome["runs"]) == 4 * len(outcome["configs"]) > len(kept)
    assert outcome["seconds"] >= sum(e["seconds"] for e in kept.values()) > 0
    assert schema.probe_so_far(attrs) == {}
    assert f"{len(kept)} runs kept from an earlier run of the confirmation" in out, out


class _Study:
    """What the memo reads and writes of an Optuna study."""

    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, key: str, value: object) -> None:
        self.user_attrs[key] = value


def test_a_measurement_is_taken_from_the_study_only_where_everything_it_measured_is_the_same() -> (
    None
):
    study, calls = _Study(), []
    cpu = torch.device("cpu")

    def measure(work, *args, device, seed):
        calls.append((work, args, seed))
        return {"a": Rate(1000.0 + len(calls), 0.01, 3, 0.2)}

    memo = Memo(study)
    first = memo.measured(
        measure, rates.measure_loaders_in_turn, {"b", "c"}, 1.5, device=cpu, seed=1
    )
    # a later run: the same measurement comes from the study, equal to what was measured
    again = Memo(study)
    same = again.measured(
        measure, rates.measure_loaders_in_turn, {"c", "b"}, 1.5, device=cpu, seed=1
    )
    assert same == first and len(calls) == 1 and again.recalled == 1
    # anything else measured differs: the function, an argument, the seed
    again.measured(measure, throughput.measure_in_turn, {"b", "c"}, 1.5, device=cpu, seed=1)
    again.measured(measure, rates.measure_loaders_in_turn, {"b", "c"}, 2.5, device=cpu, seed=1)
    again.measured(measure, rates.measure_loaders_in_turn, {"b", "c"}, 1.5, device=cpu, seed=2)
    assert len(calls) == 4 and again.recalled == 1
    # the same measurement asked for again in one run (rounds of it) is another measurement
    again.measured(measure, rates.measure_loaders_in_turn, {"b", "c"}, 1.5, device=cpu, seed=1)
    assert len(calls) == 5 and again.recalled == 1
    # what is neither figures by name nor a list of numbers is measured each time, and not kept
    odd = Memo(study)
    for _ in range(2):
        odd.measured(lambda *a, **k: 3.0, rates.measure, device=cpu, seed=1)
    assert odd.recalled == 0 and len(schema.probe_so_far(study.user_attrs)) == 5


def test_a_measurement_s_digest_is_the_same_in_every_process() -> None:
    """Sets of strings iterate in another order in another process (hash randomization): this
    one's digest against one of a process with another hash seed."""
    code = (
        "import torch; from autotune.probe import memo, rates; "
        "print(memo._digest(rates.measure, ({f'w{i}' for i in range(20)}, "
        "{'x': 1.5, 'y': (2, 3)}, torch.device('cpu'), 7)))"
    )
    here = _digest(
        rates.measure,
        ({f"w{i}" for i in range(20)}, {"x": 1.5, "y": (2, 3)}, torch.device("cpu"), 7),
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # another than this one's
    there = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
    ).stdout.strip()
    assert there == here and len(here) == 32


def test_a_kept_measurement_counts_the_seconds_it_took_and_the_compile_is_kept_as_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joint probe's phases count a kept measurement's seconds where it was measured, and
    torch.compile, weighed once at the chosen setting (a minute on a GPU), is kept like the rest:
    a probe going on from a run cut short after it does not compile again."""
    monkeypatch.chdir(REPO)
    spec = study_file.load(write_study(tmp_path, probe="joint"))
    prepared = preparation.prepare(spec)
    # a choice, as on a GPU (a CPU's space leaves it out: docs/reference.md)
    space = prepared.space.replace("compile", Choices((False, True)))
    study, calls = _Study(), []

    def measure(work, *args, device, seed):  # a compile and its plain step: seconds of waiting
        calls.append(work)
        time.sleep(0.3)
        return {"plain": Rate(1000.0, 0.01, 3, 0.1), "compiled": Rate(1500.0, 0.01, 3, 2.0)}

    def probing() -> _Probing:
        measuring = dataclasses.replace(prepared, space=space, measure=measure)
        batch, seed = 128, 5
        return _Probing(spec, measuring, batch, seed, {}, Memo(study))

    step_held = roofline.Prediction(
        {"num_workers": 0, "prefetch_factor": None, "pin_memory": False},
        {"precision": "fp32", "channels_last": False, "cudnn_benchmark": False},
        loader_rate=1e9,
        compute_rate=1000.0,
    )
    first = probing()
    weighed = _weigh_compile(first, step_held)
    assert calls == [rates.measure] and weighed["once_seconds"] == pytest.approx(1.9)
    (kept,) = schema.probe_so_far(study.user_attrs).values()
    assert kept["seconds"] >= 0.3 and first.phases["compile"] >= 0.3

    again = probing()  # the next run, cut short once the compile was weighed
    assert _weigh_compile(again, step_held) == weighed
    assert calls == [rates.measure]  # not compiled again
    assert again.memo.recalled_seconds == kept["seconds"]
    assert again.phases["compile"] >= kept["seconds"]  # counted where it was measured
