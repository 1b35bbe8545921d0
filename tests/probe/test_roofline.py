"""The roofline: rates measured apart predict a setting's speed; the joint probe chooses the
loader and the precision together where deciding one at a time goes wrong, and names what holds
the winner back."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.cli import main
from autotune.probe import rates, throughput
from autotune.probe.model import decide, figures, roofline, screening
from autotune.probe.model.outcome import loader_settings
from autotune.probe.model.text import checkpointing_text, compile_text, describe, what_moves_it
from autotune.record.summary import BUSY_CORES
from autotune.search.space import Choices, Space, complete
from autotune.train import first_steps
from autotune.train.config import TrialConfig
from autotune.train.tasks import paced

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
# How far a prediction from the rates apart may be from the end-to-end measurement on the paced
# task (docs/benchmarks.md): the step's own arithmetic and the workers' hand-over are not in the
# rates.
TOLERANCE = 0.2
# ... and for a compute-bound setting with 4 workers on 2 cores, whose workers' hand-overs take
# CPU from the step: on this 2-core machine its end-to-end speed came 12-21% below its prediction
# when quiet, 22% under a test run's load; the end-to-end measurement decides there.
SHARED_CORES_TOLERANCE = 0.3


def loader(workers: int) -> dict:
    return {
        "data_on_device": False,
        "num_workers": workers,
        "prefetch_factor": 2 if workers else None,
        "pin_memory": False,
    }


def compute(precision: str) -> dict:
    return {"precision": precision, "channels_last": False, "cudnn_benchmark": False}


def knob_space(**domains: tuple) -> Space:
    """The paced study's knob space (workers 0-4, fp32 and bf16, batches 32-128), each of
    `domains` replacing a knob's values."""
    space = Space(
        tuple(
            (name, Choices(values))
            for name, values in {
                "data_on_device": (False,),
                "num_workers": (0, 2, 4),
                "batch_size": (32, 64, 128),
                "precision": ("fp32", "bf16"),
                "channels_last": (False, True),
                "compile": (False, True),
            }.items()
        )
    )
    for name, values in domains.items():
        space = space.replace(name, Choices(values))
    return space


def test_what_would_move_a_compute_bound_limit_is_what_the_space_left_out() -> None:
    """Within the space the limit has weighed every lever: what moves it lies outside."""
    fast_loader = roofline.predict([(loader(4), 5000.0)], [compute("fp32")], lambda _, c: 2000.0)[0]
    assert fast_loader.bottleneck == roofline.COMPUTE
    everything = what_moves_it(fast_loader, knob_space(), batch=64, cores=16)
    assert (
        everything
        == "the compute: the loader could deliver 2.50x more (a faster device, or a lighter model)"
    )
    narrowed = knob_space(precision=("fp32",), channels_last=(False,), compile=(False,))
    assert what_moves_it(fast_loader, narrowed, batch=128, cores=16) == (
        "the compute: the loader could deliver 2.50x more (bf16 or fp16, which the space leaves "
        "out; channels-last, where the model has 2-D convolutions; compilation; a micro-batch "
        "larger than 128)"
    )
    # how much the last doubling of the batch gave the chosen step, where the probe measured it
    grew = what_moves_it(
        fast_loader, narrowed, batch=128, cores=16, step_rates={32: 1500.0, 64: 1800.0, 128: 2000.0}
    )
    assert grew.endswith(
        "a micro-batch larger than 128: the step ran 1.11x as fast a sample at 128 as at 64)"
    )
    # input-bound below the space's most workers: the cores held it
    slow_loader = roofline.predict([(loader(2), 1000.0)], [compute("bf16")], lambda _, c: 2000.0)
    assert (
        "(more cores (2 workers delivered the most here): at the 500 samples/s a worker "
        "delivered, about 4 would keep up; cheaper decoding"
    ) in what_moves_it(slow_loader[0], knob_space(), batch=64, cores=16)
    # at the space's most workers, on a machine with no more cores: the workers a step needs
    at_most = roofline.predict([(loader(4), 6000.0)], [compute("bf16")], lambda _, c: 9500.0)[0]
    assert (
        "(more loader workers than the space's 4, with more cores than this machine's 4: at the "
        "1,500 samples/s a worker delivered, about 7 would keep up; cheaper decoding"
    ) in what_moves_it(at_most, knob_space(), batch=64, cores=4)


def test_a_setting_runs_at_its_slower_rate_with_workers_and_at_their_sum_without() -> None:
    rates_of = {"fp32": 1000.0, "bf16": 4000.0}
    predictions = roofline.predict(
        [(loader(0), 1000.0), (loader(2), 2000.0), (loader(4), 3000.0)],
        [compute("fp32"), compute("bf16")],
        lambda _, c: rates_of[c["precision"]],
    )
    best = predictions[0]
    assert (best.loader["num_workers"], best.compute["precision"]) == (4, "bf16")
    assert best.samples_per_second == 3000.0 and best.bottleneck == roofline.INPUT
    assert best.idle_share == pytest.approx(0.25)  # the step waits a quarter of the time
    serial = next(
        p for p in predictions if p.loader["num_workers"] == 0 and p.compute["precision"] == "fp32"
    )
    assert serial.samples_per_second == pytest.approx(500.0) and serial.idle_share == pytest.approx(
        0.5
    )
    fp32 = next(
        p for p in predictions if p.loader["num_workers"] == 4 and p.compute["precision"] == "fp32"
    )
    assert fp32.bottleneck == roofline.COMPUTE and fp32.samples_per_second == 1000.0
    # the best with no workers is checked too where it starts sooner and could finish a run the
    # study might train: the frontier says for which run lengths
    starts = [(p, 0.05 if not p.overlapped else 0.5) for p in predictions]
    timed = roofline.frontier(starts)
    assert [p.loader["num_workers"] for p, _ in timed] == [4, 0]
    crossing = roofline.crossing(
        (timed[0][0].samples_per_second, 0.5), (timed[1][0].samples_per_second, 0.05)
    )
    assert crossing == pytest.approx(0.45 / (1 / 800 - 1 / 3000))  # 491 samples
    assert decide.fastest_within(timed, crossing * 1.01, 10_000) == timed[:1]
    assert decide.fastest_within(timed, 10, crossing * 0.99) == timed[1:]
    assert decide.fastest_within(timed, crossing * 0.99, 10_000) == timed
    # soonest over a long run first, then the frontier's serial setting
    checked = decide.to_check(starts, samples=10_000, count=2, within=(crossing * 0.99, 10_000))
    assert [p.loader["num_workers"] for p, _ in checked] == [4, 2, 0]
    # ... over a short one the serial setting ranks first and is not checked twice
    short = decide.to_check(starts, samples=100, count=2, within=(50, 200))
    assert [p.loader["num_workers"] for p, _ in short] == [0, 0]
    assert decide.decide(
        [(checked[0][0], 2500.0, 0.5), (checked[1][0], 2700.0, 0.5), (checked[2][0], None, 0.05)],
        samples=10_000,
    ) == (checked[1][0], 2700.0)
    moves = what_moves_it(best, knob_space(), batch=128, cores=2)
    assert moves == (
        "the input pipeline: the step could run 1.33x faster if loading kept up (more loader "
        "workers than the space's 4, with more cores than this machine's 2: at the 750 samples/s "
        "a worker delivered, about 6 would keep up; cheaper decoding, "
        "or the training set on the device)"
    )
    # where the space weighed the training set on the device already, that is no lever left
    weighed = what_moves_it(best, knob_space(data_on_device=(False, True)), batch=128, cores=2)
    assert weighed.endswith("about 6 would keep up; cheaper decoding)")
    # the batches made on the device are the input: their gather is what holds the step
    device = {
        "data_on_device": True,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    gathered = roofline.predict([(device, 1000.0)], [compute("bf16")], lambda _, c: 4000.0)[0]
    assert not gathered.overlapped and gathered.samples_per_second == pytest.approx(800.0)
    assert what_moves_it(gathered, knob_space(), batch=128, cores=2) == (
        "the batches made on the device: the step could run 4.00x faster beside a cheaper gather "
        "there"
    )
    # Held by one loader, two steps measure alike: within the windows' noise the faster step wins
    # (it runs ahead wherever batches wait), outside it the measurement.
    slow_step, fast_step = (
        roofline.Prediction(loader(4), compute(p), loader_rate=3000.0, compute_rate=rate)
        for p, rate in (("fp32", 3500.0), ("bf16", 6000.0))
    )
    run = {"samples": 30_000}
    assert decide.decide([(slow_step, 3050.0, 0.5), (fast_step, 2950.0, 0.5)], **run) == (
        fast_step,
        2950.0,
    )
    assert decide.decide([(slow_step, 3200.0, 0.5), (fast_step, 2950.0, 0.5)], **run) == (
        slow_step,
        3200.0,
    )


def test_a_setting_without_a_rate_is_left_out_and_nothing_to_decide_is_said() -> None:
    assert roofline.predict([(loader(2), None)], [compute("fp32")], lambda *_: 1000.0) == []
    assert roofline.predict([(loader(2), 100.0)], [compute("fp32")], lambda *_: None) == []
    with pytest.raises(ValueError):
        decide.decide([], samples=1000)


def config(**settings) -> TrialConfig:
    base = {
        "lr": 0.05,
        "scheduler": "constant",
        "batch_size": 128,
        "accumulation_steps": 1,
        **loader(0),
        **compute("fp32"),
    }
    return TrialConfig.from_mapping(complete({**base, **settings}))


def test_rates_apart_follow_the_set_costs_and_predict_the_end_to_end_speed() -> None:
    # smaller costs let the step's own arithmetic and hand-overs show
    batch = 64  # a window is 10 steps: half as long as at 128
    load_seconds = paced.LOAD_SECONDS
    task = paced.make(load_seconds=load_seconds, compute_seconds=paced.COMPUTE_SECONDS)
    loaders = {f"w{w}": config(**loader(w), batch_size=batch) for w in (0, 2, 4)}
    # the step rates the predictions below read: fp32 without workers and beside four, bf16
    # beside four (bf16 without workers would be one more setting in every round, read by none)
    computes = {
        f"{p}@{w}": config(**compute(p), num_workers=w, batch_size=batch)
        for p, w in (("fp32", 0), ("fp32", 4), ("bf16", 4))
    }
    measured = rates.measure(task, loaders, computes, device=CPU, seed=1)
    speed = {k: v.samples_per_second for k, v in measured.items()}
    # the loader: workers / load cost; the step: 1 / compute cost, half that under bf16
    assert speed["w0"] == pytest.approx(1 / load_seconds, rel=0.15)
    assert speed["w2"] == pytest.approx(2 * speed["w0"], rel=0.15)
    assert speed["w4"] > 1.4 * speed["w2"]
    assert speed["bf16@4"] == pytest.approx(2 * speed["fp32@4"], rel=0.2)
    assert all(v.spread is not None and v.windows >= 3 for v in measured.values())
    assert measured["w4"].fixed_seconds > measured["w0"].fixed_seconds  # four workers to start

    combos = {
        (w, p): config(**loader(w), **compute(p), batch_size=batch)
        for w, p in ((0, "fp32"), (2, "fp32"), (2, "bf16"), (4, "bf16"))
    }
    end_to_end = throughput.measure(
        task, {f"{w}-{p}": c for (w, p), c in combos.items()}, device=CPU, seed=1
    )
    for w, p in combos:
        predicted = roofline.Prediction(
            loader(w), compute(p), speed[f"w{w}"], speed[f"{p}@{0 if w == 0 else 4}"]
        )
        assert end_to_end[f"{w}-{p}"].samples_per_second == pytest.approx(
            predicted.samples_per_second, rel=TOLERANCE
        ), (w, p)


def test_a_process_s_first_steps_land_on_no_setting_s_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a process's first steps load (on a GPU, 1 s on an H200) is paid before any setting
    is timed: otherwise the setting measured first would carry it, and lose every short run."""
    task = paced.make(
        load_seconds=0.05e-3, compute_seconds=0.05e-3, narrow_factor=1.0, first_step_seconds=1.0
    )
    monkeypatch.setattr(first_steps, "_taken", set())  # as in a fresh process
    measured = rates.measure_in_groups(
        task,
        {p: config(**compute(p)) for p in ("fp32", "bf16")},
        rates.COMPUTE_GROUP,
        device=CPU,
        seed=1,
    )
    starts = {k: v.fixed_seconds for k, v in measured.items()}
    assert max(starts.values()) < 0.5, starts
    # ... and it was paid: the task's first step has waited
    assert task.model().first_use == {}
    # ... and measured, as a figure of its own: the first of two plain steps' start-up beyond
    # the second's (the 1 s wait, and what torch loads on its first steps in a fresh process)
    first = {v.first_steps_seconds for v in measured.values()}
    assert len(first) == 1 and 0.9 < first.pop() < 5.0
    again = rates.measure_in_groups(
        task, {"fp32": config(**compute("fp32"))}, rates.COMPUTE_GROUP, device=CPU, seed=1
    )
    assert again["fp32"].first_steps_seconds is None  # this process had taken them
    # the report says what a trial in a fresh process pays, on a device the loader does not
    # share (a GPU's)
    outcome = {
        "batch_size": 128,
        "loader_rates": [{**loader(2), "samples_per_second": 5000.0, "fixed_seconds": 0.3}],
        "compute_rates": [
            {**compute(p), **rate.as_json(), "threads": 1} for p, rate in measured.items()
        ],
        "limit": {**loader(2), **compute("bf16"), "predicted": 4000.0, "bottleneck": "compute"},
        "chosen": {
            **loader(2),
            **compute("bf16"),
            "predicted": 4000.0,
            "measured": 3900.0,
            "loader_rate": 5000.0,
            "compute_rate": 4000.0,
            "bottleneck": "compute",
            "idle_share": 0.0,
        },
        "checked": [],
        "seconds": 5.0,
        "moves": "a larger batch",
    }
    said = f"A process's first steps took {measured['fp32'].first_steps_seconds:.2f} s more than"
    assert said in describe({**outcome, "shared_cores": False})
    assert said not in describe({**outcome, "shared_cores": True})


def write_study(
    folder: Path,
    *,
    probe: str,
    task: str = "tests.tasks:paced_quick",
    name: str | None = None,
    **budget,
) -> Path:
    study = {
        "task": task,
        "target": {"metric": "accuracy", "value": 0.5},
        # the paced step's cost is a wait: nothing for a fused step to save
        "space": {
            "lr": 0.05,
            "scheduler": "constant",
            "batch_size": [32, 128],
            "accumulation_steps": 1,
            "num_workers": [0, 2, 4],
            "prefetch_factor": 2,
            "precision": ["fp32", "bf16"],
            "fused_optimizer": False,
        },
        "baseline": {"lr": 0.05, "batch_size": 32},
        "probe": probe,
        "budget": {"trials": 1, "max_epochs": 1, "max_seconds": 5, "eval_every": 0.5, **budget},
        "confirm": {"top": 0},
    }
    path = folder / f"{name or probe}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def load(path: Path) -> optuna.Study:
    return optuna.load_study(study_name=path.stem, storage=f"sqlite:///{path.with_suffix('.db')}")


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # so that `tests.tasks:...` imports


def test_choosing_loader_and_precision_together_finds_what_one_at_a_time_misses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the paced task a loader chosen at fp32 would stop at two workers; together, bf16 with
    four, where the probe measured on a quiet machine. Whatever the load, the choice is the
    soonest of what it measured end to end, and the trial trains there."""
    # trials of up to 4 epochs: four workers start later than two, and over a run of one epoch
    # a slow start on a loaded machine could outweigh their faster rate
    path = write_study(tmp_path, probe="joint", max_epochs=4)
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    joint = load(tmp_path / "joint.yaml").user_attrs["probe"]
    phases = joint["phase_seconds"]  # where the probe's time went, each phase timed
    assert {"compute", "loaders", "end_to_end"} <= set(phases)
    assert f"compute {phases['compute']:.0f} s, loaders {phases['loaders']:.0f} s" in out
    assert "Limit of the knob space: " in out
    assert "the end-to-end measurement decided" in out  # a CPU: loader and step share the cores
    # the trial trains at the setting the probe chose
    trial = load(tmp_path / "joint.yaml").trials[0]
    chosen = joint["chosen"]
    assert (
        trial.params.get("num_workers", chosen["num_workers"]),
        trial.params.get("precision", chosen["precision"]),
    ) == (chosen["num_workers"], chosen["precision"])
    # whatever the load: the choice is the soonest over the run of what was measured end to end,
    # unless the paired windows could not show it faster than the baseline's setting, kept then
    seconds = {
        (c["num_workers"], c["precision"]): c["start_up"] + joint["run_samples"] / c["measured"]
        for c in joint["checked"]
        if c["measured"]
    }
    picked = (chosen["num_workers"], chosen["precision"])
    if joint.get("paired", {}).get("kept") == "baseline":
        assert picked == (0, "fp32")
    else:
        assert seconds[picked] <= (1 + decide.TIE) * min(seconds.values())
    if (joint.get("other_cores") or 0) >= BUSY_CORES:
        # Other processes took the cores as it measured: the workers' hand-overs and the step
        # competed with them, and what the probe chose suits that load (as the report says), not
        # the task's set costs. The choice below is the quiet machine's.
        assert "so these choices suit that load, not a quiet machine" in out
        return
    assert joint["loader"]["num_workers"] == 4 and joint["precisions"] == ["bf16"]
    assert joint["chosen"]["bottleneck"] == "compute" and joint["limit"]["num_workers"] == 4
    assert chosen["measured"] == pytest.approx(chosen["predicted"], rel=SHARED_CORES_TOLERANCE)
    loader_bound = next(
        c for c in joint["checked"] if (c["num_workers"], c["precision"]) == (2, "bf16")
    )
    assert loader_bound["measured"] == pytest.approx(loader_bound["predicted"], rel=TOLERANCE)
    assert {(c["num_workers"], c["precision"]) for c in joint["checked"]} >= {
        (4, "bf16"),
        (2, "bf16"),
    }
    assert "Joint systems probe (batch 128: 3 loader and 4 compute settings measured apart" in out
    # "paired": the choice against the baseline's setting (0 workers, fp32) in paired windows
    assert set(phases) == {"compute", "loaders", "end_to_end", "paired", "batches"} and all(
        v > 0 for v in phases.values()
    )
    assert joint["paired"]["kept"] == "chosen" and len(joint["paired"]["ratios"]) == 3
    assert "compute-bound" in out
    # the study asked for channels-last and compilation (the preset's), which the paced MLP and
    # the CPU fitted away: neither is named as a lever
    assert joint["moves"].startswith("the compute: the loader could deliver ")
    assert joint["moves"].endswith(" as fast a sample at 128 as at 32)")
    assert (trial.params.get("num_workers", 4), trial.params.get("precision", "bf16")) == (
        4,
        "bf16",
    )


def test_the_probe_chooses_the_setting_soonest_over_the_run_the_budget_allows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bf16 trains twice as fast after a start 1 s later: for trials of one epoch (4,096 samples)
    the probe keeps fp32, and does not measure bf16 end to end: even at twice its predicted speed
    it would finish every run the study trains later. (A long budget takes the faster rate: the
    next test.)"""
    path = write_study(tmp_path, probe="joint", task="tests.tasks:paced_narrow_start", max_epochs=1)
    study_file = yaml.safe_load(path.read_text())
    # fewer settings to measure: four workers alone (the precision is the choice here), so the
    # baseline's setting (no workers) is none of them and no paired check runs
    study_file["space"].update(batch_size=128, num_workers=4)
    path.write_text(yaml.safe_dump(study_file))
    # its one trial stops at the target, at its first evaluation
    assert main(["run", str(path), "--quiet"]) == 0
    outcome = load(path).user_attrs["probe"]
    shortest, longest = outcome["run_range"]
    assert (shortest, longest) == (0.5 * 4096, 4096)
    assert outcome["run_samples"] == pytest.approx(math.sqrt(shortest * longest))
    # the choice is the soonest of what was checked, start-up as measured apart counted
    seconds = {
        (c["num_workers"], c["precision"]): c["start_up"] + outcome["run_samples"] / c["measured"]
        for c in outcome["checked"]
        if c["measured"]
    }
    picked = (outcome["chosen"]["num_workers"], outcome["chosen"]["precision"])
    # the baseline's setting (no workers) lies outside this space: nothing to pair the choice with
    assert "paired" not in outcome
    assert seconds[picked] <= (1 + decide.TIE) * min(seconds.values())
    assert picked[1] == "fp32"
    bf16 = [c for c in outcome["checked"] if c["precision"] == "bf16"]
    fp32_starts = [c["start_up"] for c in outcome["checked"] if c["precision"] == "fp32"]
    assert bf16 and all(c["measured"] is None for c in bf16)
    assert min(c["start_up"] for c in bf16) > max(fp32_starts) + 0.5  # the first bf16 step's wait
    assert all(c["reason"].startswith(decide.OUTRUN) for c in bf16)
    # outrun over every run the study trains, bf16 cannot win: the search keeps fp32 alone
    assert outcome["precisions"] == ["fp32"]
    report = report_of(path, capsys)
    assert f"Chosen for a run of {outcome['run_samples']:,.0f} samples" in report
    measured = sum(1 for c in outcome["checked"] if c["measured"])
    left = len(outcome["checked"]) - measured
    assert f"{measured} end to end ({left} more outrun before their turn)" in report


def test_once_a_trial_reaches_the_target_the_next_train_at_the_setting_soonest_over_its_run(
    tmp_path: Path,
) -> None:
    """Four loader workers feed bf16 four times as fast as none, after 3 s of start-up: the probe
    takes them for the run it estimates from a budget of 200 epochs (about 40,000 samples); the
    first trial reaches the target within a few thousand, over which no workers finish sooner,
    and the trials after it train there, at the same precision. (Where a loaded machine left no
    sooner setting measured, they stay at the first's.)"""
    path = write_study(
        tmp_path,
        probe="joint",
        task="tests.tasks:paced_worker_start",
        name="follows",
        trials=2,  # the first, and one after it
        max_epochs=200,
        max_seconds=60,
    )
    study_file = yaml.safe_load(path.read_text())
    # at batch 32 every trial reaches the target at its first evaluation (2,048 samples): a run
    # none of the workers' settings wins, however loaded the machine; each setting with workers
    # the probe measures waits their start-up, so it measures few
    study_file["space"].update(batch_size=32, num_workers=[0, 4], precision="bf16")
    path.write_text(yaml.safe_dump(study_file))
    assert main(["run", str(path), "--quiet"]) == 0
    study = load(path)
    outcome = study.user_attrs["probe"]
    first, *later = [t.user_attrs["config"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert first["num_workers"] == outcome["chosen"]["num_workers"]
    samples = study.trials[0].user_attrs["result"]["samples_to_target"]
    assert samples == 2_048
    # the run the probe chose for: far longer than the first trial needed (about 40,000 samples
    # on a quiet machine; the longest run is 60 s at the fastest rate, so fewer on a loaded one)
    shortest, longest = outcome["run_range"]
    assert shortest == samples and longest <= 200 * 4096
    assert outcome["run_samples"] == pytest.approx(math.sqrt(shortest * longest))
    assert outcome["run_samples"] > samples
    knobs = ("num_workers", "prefetch_factor", "precision")
    assert later
    # Which setting the probe takes, and which it measured end to end, rests on the machine's
    # load: as a rule four workers, with none measured end to end and soonest over the first
    # trial's run; on a loaded machine the step without workers may measure too slow apart to be
    # checked, and nothing is sooner. Either way the trials after the first train at the setting
    # the probe's table says is soonest over the run the first one needed.
    moved = figures.setting_for_run(outcome, samples, first)
    expected = {**first, **(moved or {})}
    assert all(tuple(c[k] for k in knobs) == tuple(expected[k] for k in knobs) for c in later)
    if moved is not None:  # as on a quiet machine: no workers, at the same precision
        assert tuple(expected[k] for k in knobs) == (0, None, first["precision"])
        # ... a setting the probe measured end to end, as soon over that run as the table says
        serial = next(c for c in outcome["checked"] if c["num_workers"] == 0 and c["measured"])
        assert serial["start_up"] + samples / serial["measured"] < first_time(outcome, samples)


def first_time(outcome: dict, samples: float) -> float:
    chosen = next(
        c
        for c in outcome["checked"]
        if all(c[k] == outcome["chosen"][k] for k in ("num_workers", "precision"))
    )
    return chosen["start_up"] + samples / chosen["measured"]


def checked_at(workers: int, precision: str, measured: float, start: float) -> dict:
    """A setting as the joint probe stores its end-to-end check."""
    return {
        **loader(workers),
        **compute(precision),
        "loader_rate": measured,
        "compute_rate": 16_000.0,
        "measured": measured,
        "start_up": start,
    }


def test_a_setting_moves_for_the_run_found_only_where_it_is_clearly_sooner() -> None:
    entry = checked_at
    outcome = {
        "checked": [
            entry(4, "bf16", 13_000.0, 2.0),
            entry(0, "bf16", 3_100.0, 0.01),
            entry(0, "fp32", 9_000.0, 0.01),  # sooner still, but another precision: other maths
        ]
    }
    current = {**loader(4), **compute("bf16"), "lr": 0.1}
    assert figures.setting_for_run(outcome, 2_048, current) == {
        **loader(0),
        **compute("bf16"),
    }
    assert figures.setting_for_run(outcome, 100_000, current) is None
    # 2.62 s against 2.59 s: within the windows' noise, no reason to move
    assert figures.setting_for_run(outcome, 8_000, current) is None
    # a setting the probe did not check has nothing to weigh against
    assert figures.setting_for_run(outcome, 2_048, {**current, **loader(2)}) is None


def test_only_the_knobs_the_probe_fixed_move_and_only_all_together() -> None:
    from autotune.probe import chosen_setting

    checked = [checked_at(4, "bf16", 13_000.0, 2.0), checked_at(0, "bf16", 3_100.0, 0.01)]
    formats = {"channels_last": False, "cudnn_benchmark": False}
    outcome = {"kind": "joint", "chosen": checked[0], "fixed": formats, "checked": checked}

    def space(workers: int = 4, **sampled: tuple) -> Space:
        fixed = {**loader(workers), "precision": "bf16", **formats}
        # with no workers the probe leaves prefetch_factor as the study file has it
        fixed = {k: v for k, v in fixed.items() if v is not None}
        domains = {k: Choices((v,)) for k, v in fixed.items()}
        domains.update({k: Choices(v) for k, v in sampled.items()})
        return Space(tuple(domains.items()))

    config = {**loader(4), **compute("bf16"), "lr": 0.1}
    moved = chosen_setting.for_run(outcome, space(), config, 2_048)
    assert moved == {**config, **loader(0)}  # prefetch_factor gone with the workers
    assert chosen_setting.for_run(outcome, space(), config, None) == config  # nothing reached
    assert chosen_setting.for_run(outcome, space(), config, math.nan) == config  # not counted
    # a loader knob the sampler chooses: moving the rest alone would train an unchecked mix
    assert chosen_setting.for_run(outcome, space(num_workers=(0, 4)), config, 2_048) == config
    assert chosen_setting.for_run({**outcome, "chosen": None}, space(), config, 2_048) == config
    # back to workers over a long run: they queue as the probe measured them
    serial = {**config, **loader(0)}
    at_serial = {**outcome, "chosen": checked[1]}
    workers = chosen_setting.for_run(at_serial, space(0, prefetch_factor=(2, 4)), serial, 100_000)
    assert workers == {**config, **loader(4)}


def report_of(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    return capsys.readouterr().out


def test_the_report_names_an_input_bound_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, probe="joint", task="tests.tasks:paced_input_bound")
    raw = yaml.safe_load(path.read_text())
    # one micro-batch and one precision: the loader holds every step, so the workers are the
    # choice; fewer settings to measure
    raw["space"].update(batch_size=128, precision="fp32")
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    outcome = load(path).user_attrs["probe"]
    assert outcome["limit"]["bottleneck"] == "input"
    # the workers chosen end to end: the most, where the probe measured on a quiet machine (on a
    # loaded one their hand-overs compete with other processes, and the choice suits that load)
    if (outcome.get("other_cores") or 0) < BUSY_CORES:
        assert outcome["loader"]["num_workers"] == 4
    assert "input-bound" in out and "what would move it: the input pipeline" in out
    # the winner beside the limit, as times: its samples at the limit's rate after its start-up

    limit = outcome["limit"]
    start = figures.start_up_seconds(outcome, limit)
    loader_start = next(
        r["fixed_seconds"]
        for r in outcome["loader_rates"]
        if r["num_workers"] == limit["num_workers"] and r["pin_memory"] == limit["pin_memory"]
    )
    assert start >= loader_start > 0  # its workers' start-up, and its step's
    assert math.isfinite(outcome["seconds"]) and outcome["seconds"] > 0
    # the winner's time beside the prediction, where it trained at the setting and batch measured
    trial = load(path).trials[0]
    params = trial.params
    at_chosen = (
        trial.user_attrs["result"]["reached"]
        and params.get("batch_size", 32) == outcome["batch_size"]
        and all(params.get(k, v) == v for k, v in outcome["chosen"].items() if k in params)
    )
    assert ("Predicted at the setting the probe chose" in out) == at_chosen


def test_the_report_sets_the_winner_beside_the_limit_as_times() -> None:
    """The winner's samples to the target at the limit's rate, after the limit setting's start-up
    (its loader's and its step's, as measured apart), beside the time it took."""
    import types

    from autotune.report import winner

    setting = {**loader(4), **compute("bf16")}
    outcome = {
        "batch_size": 128,
        "limit": {**setting, "predicted": 4000.0},
        "loader_rates": [
            {**loader(2), "fixed_seconds": 9.0},  # another setting's start-up: not this one's
            {**loader(4), "samples_per_second": 4100.0, "fixed_seconds": 0.3},
        ],
        "compute_rates": [{**compute("bf16"), "fixed_seconds": 0.2}],
    }
    assert figures.start_up_seconds(outcome, outcome["limit"]) == pytest.approx(0.5)
    best = types.SimpleNamespace(samples_to_target=6000.0, time_to_target=4.0)
    assert winner.limit_line(outcome, best) == (
        "At the knob space's limit (4,000 samples/s predicted at batch 128, after 0.50 s of "
        "start-up measured apart) the winner's 6,000 samples to the target would take 2.00 s; "
        "it took 4.00 s, 2.00x the limit."
    )
    uncounted = types.SimpleNamespace(samples_to_target=None, time_to_target=4.0, params={})
    assert winner.limit_line(outcome, uncounted) is None
    assert winner.limit_line({"limit": None}, best) is None
    # beside the prediction at the setting the probe chose: its start-up and its rate measured end
    # to end, where the winner trained at that setting and the batch it was measured at
    outcome["chosen"] = {**setting, "predicted": 4000.0, "measured": 3000.0}
    best.params = {**setting, "batch_size": 128, "lr": 0.1}
    assert winner.prediction_line(outcome, best) == (
        "Predicted at the setting the probe chose (3,000 samples/s at batch 128, measured end to "
        "end, after 0.50 s of start-up): 2.50 s for the winner's 6,000 samples; it took 4.00 s "
        "(+60%)."
    )
    # a winner at another setting checked end to end (trials move there once one has reached the
    # target: chosen_setting.for_run): at the probe's batch, as that check measured it
    moved = {**loader(0), **compute("bf16")}
    checked = {**moved, "predicted": 2000.0, "measured": 1500.0, "start_up": 0.1}
    elsewhere = types.SimpleNamespace(
        samples_to_target=6000.0, time_to_target=4.5, params={**moved, "batch_size": 128}
    )
    assert winner.prediction_line({**outcome, "run_samples": 40_960}, elsewhere) is None
    with_checked = {**outcome, "run_samples": 40_960, "checked": [checked]}
    assert winner.prediction_line(with_checked, elsewhere) == (
        "Predicted at another setting the probe checked end to end (1,500 samples/s at batch "
        "128, measured end to end, after 0.10 s of start-up): 4.10 s for the winner's 6,000 "
        "samples; it took 4.50 s (+10%)."
    )
    # checked without checkpointing: a run that recomputes is another rate
    recomputes = {**elsewhere.params, "checkpointing": True}
    assert winner.predicted_seconds(with_checked, recomputes, 6000.0) is None
    elsewhere.params["batch_size"] = 32  # measured at the probe's batch alone
    assert winner.prediction_line(with_checked, elsewhere) is None
    # and the limit line then says what held it there, in seconds that add up to the difference
    assert winner.limit_line(outcome, best).endswith(
        "it took 4.00 s, 2.00x the limit. The 2.00 s between: +0.50 s of rate (the winner's "
        "setting 3,000 samples/s end to end, against the limit's 4,000 predicted from its rates "
        "apart), +0.00 s of start-up (0.50 s against 0.50 s, each measured apart), +1.50 s the "
        "run beside its prediction."
    )
    # a chosen setting other than the limit's (a fused step, its first steps dearer)
    steps = {
        fused: {**compute("bf16"), "fused_optimizer": fused, "fixed_seconds": 0.6 if fused else 0.2}
        for fused in (True, False)
    }
    dearer = {
        **outcome,
        "limit": {**outcome["limit"], "fused_optimizer": False},
        "compute_rates": list(steps.values()),
        "chosen": {**setting, "fused_optimizer": True, "predicted": 4000.0, "measured": 3000.0},
    }
    best.params = {**setting, "fused_optimizer": True, "batch_size": 128}
    assert "+0.40 s of start-up (0.90 s against 0.50 s, each measured apart), +1.10 s the run" in (
        winner.limit_line(dearer, best)
    )
    best.params = {**setting, "batch_size": 128, "lr": 0.1}
    for other in ({"precision": "fp32"}, {"batch_size": 64}, {"num_workers": 2}):
        assert winner.predicted_seconds(outcome, {**best.params, **other}, 6000.0) is None
        elsewhere = types.SimpleNamespace(**{**vars(best), "params": {**best.params, **other}})
        assert winner.limit_line(outcome, elsewhere).endswith("2.00x the limit.")
    assert winner.prediction_line(outcome, uncounted) is None
    assert winner.prediction_line({"chosen": None}, best) is None
    # confirmation runs that counted their samples, else the trial's own
    runs = [{"samples_to_target": 5000}, {"samples_to_target": 7000}, {"reached": False}]
    assert winner.samples_to_target(runs, {"samples_to_target": 1}) == 6000.0
    assert winner.samples_to_target([], {"samples_to_target": 1234}) == 1234.0
    assert winner.samples_to_target([], None) is None


def test_the_limit_of_a_short_run_is_the_setting_that_starts_sooner() -> None:
    """Pinning and more workers deliver faster but start later: over a short run the setting that
    starts sooner finishes first. The frontier keeps each setting that is fastest for some run
    length, and the limit of a run is the one of them with the least start-up + samples / rate."""
    import types

    from autotune.report import winner

    def pinned(workers: int) -> dict:
        return {**loader(workers), "pin_memory": True}

    # (loader, its rate, its start-up): the step (bf16, 0.1 s to start) runs 2,000/s
    loaders = [
        (pinned(4), 1000.0, 0.8),
        (loader(4), 900.0, 0.4),
        (pinned(2), 800.0, 0.6),  # slower and later than unpinned 4: never the limit
        (loader(2), 600.0, 0.35),  # sooner, but never the fastest: 4 unpinned or 1 overtake it
        (loader(1), 500.0, 0.2),
    ]
    timed = [
        (roofline.Prediction(setting, compute("bf16"), rate, 2000.0), start + 0.1)
        for setting, rate, start in loaders
    ]
    kept = roofline.frontier(timed)
    assert [p.loader_rate for p, _ in kept] == [1000.0, 900.0, 500.0]

    def fastest(samples: float) -> float:
        return min(timed, key=lambda t: t[1] + samples / t[0].samples_per_second)[0].loader_rate

    # every run length's fastest setting is kept, and each kept is the fastest for some length
    lengths = [10.0 * 1.1**k for k in range(120)]
    assert {fastest(n) for n in lengths} == {p.loader_rate for p, _ in kept}
    crossing = roofline.crossing((1000.0, 0.9), (900.0, 0.5))
    assert crossing == pytest.approx(3600.0)
    assert fastest(crossing * 0.99) == 900.0 and fastest(crossing * 1.01) == 1000.0
    # stored as the probe stores it, and read back for a run's length
    outcome = {
        "batch_size": 128,
        "limit": kept[0][0].figures(),
        "frontier": [p.figures() for p, _ in kept],
        "loader_rates": [{**s, "samples_per_second": r, "fixed_seconds": f} for s, r, f in loaders],
        "compute_rates": [{**compute("bf16"), "samples_per_second": 2000.0, "fixed_seconds": 0.1}],
    }
    for samples in (100.0, 2000.0, 3000.0, 5000.0):
        limit = figures.limit_for(outcome, samples)
        assert limit["loader_rate"] == fastest(samples)
        assert limit["seconds"] == pytest.approx(limit["start_up"] + samples / limit["predicted"])
    # an outcome stored before the frontier: found again from its rates where the step ran alike
    # beside every loader (a GPU's), else its fastest rate alone
    older = {k: v for k, v in outcome.items() if k != "frontier"}
    assert figures.limit_for(older, 100.0)["loader_rate"] == 1000.0
    for samples in (100.0, 2000.0, 3000.0, 5000.0):
        found = figures.limit_for({**older, "shared_cores": False}, samples)
        assert found["loader_rate"] == fastest(samples)
    # steps that tie at their loader's rate (input-bound, as on a GPU): rebuilt from an older
    # outcome's rates, the fastest is the one that starts soonest, and no "sooner" is named for it
    tied = {
        "batch_size": 128,
        "shared_cores": False,
        "limit": {**pinned(4), **compute("fp32"), "predicted": 1000.0},
        "loader_rates": [{**pinned(4), "samples_per_second": 1000.0, "fixed_seconds": 0.8}],
        "compute_rates": [
            {**compute("fp32"), "samples_per_second": 3000.0, "fixed_seconds": 0.3},
            {**compute("bf16"), "samples_per_second": 4000.0, "fixed_seconds": 0.1},
        ],
    }
    long_run = types.SimpleNamespace(samples_to_target=1e6, time_to_target=2000.0, params={})
    tied_limit = figures.limit_for(tied, 1e6)
    assert tied_limit["precision"] == "bf16" and tied_limit["fastest"]
    assert "starting sooner" not in winner.limit_line(tied, long_run)
    # on a CPU the step's start-up as measured with the threads the loader's workers left it
    shared = {
        "shared_cores": True,
        "cores": 2,
        "loader_rates": [{**loader(0), "fixed_seconds": 0.0}, {**loader(1), "fixed_seconds": 0.2}],
        "compute_rates": [
            {**compute("fp32"), "threads": 1, "fixed_seconds": 0.6},
            {**compute("fp32"), "threads": 2, "fixed_seconds": 0.15},
        ],
    }
    start_up = figures.start_up_seconds
    assert start_up(shared, {**loader(0), **compute("fp32")}) == pytest.approx(0.15)
    assert start_up(shared, {**loader(1), **compute("fp32")}) == pytest.approx(0.8)
    # the report: the limit the probe names, the setting that beats it over a short run
    lines = describe(
        {
            **outcome,
            "chosen": {**kept[0][0].figures(), "measured": 950.0},
            "checked": [],
            "seconds": 10.0,
            "moves": "more workers",
        }
    ).splitlines()
    assert (
        "for a run of under 3,600 samples, faster as it starts sooner: num_workers 4, "
        "prefetch_factor 2, pin_memory false, bf16 (900/s after 0.50 s of start-up against "
        "0.90 s), and 1 more for shorter runs still;" in lines[1]
    )
    # the winner beside the limit for its own samples
    best = types.SimpleNamespace(samples_to_target=2000.0, time_to_target=4.0, params={})
    assert winner.limit_line(outcome, best) == (
        "At the knob space's limit (900 samples/s predicted at batch 128, after 0.50 s of "
        "start-up measured apart; num_workers 4, prefetch_factor 2, pin_memory false, bf16, "
        "starting sooner than the fastest rate's 1,000/s) the winner's 2,000 samples to the "
        "target would take 2.72 s; it took 4.00 s, 1.47x the limit."
    )
    best.samples_to_target = 20_000.0
    assert "(1,000 samples/s predicted at batch 128, after 0.90 s of start-up measured apart)" in (
        winner.limit_line(outcome, best)
    )


def test_start_ups_under_a_tenth_of_a_second_read_in_milliseconds() -> None:
    """On a CPU a setting that starts sooner may do so by milliseconds: 0.00 s against 0.00 s
    would say nothing."""
    from autotune.probe.model.text import short

    assert [short(s) for s in (0.0, 0.0014, 0.0046, 0.0999, 0.1, 2.5)] == [
        "0 ms",
        "1 ms",
        "5 ms",
        "100 ms",
        "0.10 s",
        "2.50 s",
    ]


def test_a_task_that_fails_in_the_probe_settles_nothing_and_the_study_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, probe="joint", task="tests.tasks:bad_sample")
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(num_workers=[0, 1], precision="fp32")
    path.write_text(yaml.safe_dump(raw))
    # its trial reaches the target before the bad sample
    assert main(["run", str(path), "--quiet"]) == 0
    outcome = load(path).user_attrs["probe"]
    assert outcome["chosen"] is None and outcome["unsettled"].startswith("a measurement failed: ")
    out = capsys.readouterr().out
    assert "Joint systems probe (batch 32: 0 loader and 0 compute settings measured apart" in out
    assert "nothing settled, as a measurement failed: " in out
    assert len(load(path).trials) == 1


def test_a_compile_pays_back_only_where_the_step_holds_the_setting() -> None:
    """Compiling costs once and saves a share of each step's time: after once / (1/plain - 1/faster)
    samples. On an input-bound setting a faster step saves nothing, so it never pays back."""
    compute_bound = roofline.Prediction(
        loader(4), compute("fp32"), loader_rate=4000.0, compute_rate=1000.0
    )
    paid = roofline.payback(compute_bound, compute_rate=2000.0, once_seconds=10.0)
    assert paid.samples == pytest.approx(10.0 / (1 / 1000 - 1 / 2000))  # 20,000 samples
    assert paid.pays_within(20_000) and not paid.pays_within(19_000)
    input_bound = roofline.Prediction(
        loader(4), compute("fp32"), loader_rate=800.0, compute_rate=1000.0
    )
    assert roofline.payback(input_bound, compute_rate=2000.0, once_seconds=10.0).samples is None
    serial = roofline.Prediction(
        loader(0), compute("fp32"), loader_rate=1000.0, compute_rate=1000.0
    )
    assert roofline.payback(serial, compute_rate=2000.0, once_seconds=1.0).samples == pytest.approx(
        1.0 / (1 / 500 - 1 / 667), rel=0.01
    )


def test_the_joint_probe_measures_a_compile_once_and_weighs_it_against_the_longest_trial(
    tmp_path: Path,
) -> None:
    """torch.compile of the chosen step, really compiled on this CPU beside the same step
    uncompiled: its start-up is its cost; a budget too short to win it back fixes it off, and the
    report says after how many steps it would pay back."""
    from autotune.probe import chosen_setting
    from autotune.spec import study_file
    from autotune.study import preparation
    from autotune.train import systems

    if systems.compile_problem(CPU):
        pytest.skip(systems.compile_problem(CPU))
    path = tmp_path / "compiled.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": "tests.tasks:blobs",
                "target": {"metric": "accuracy", "value": 0.9},
                "budget": {"trials": 1, "max_epochs": 1},
            }
        )
    )
    spec = study_file.load(path)
    prepared = preparation.prepare(spec)
    plain = config(batch_size=64)
    # the step holds it
    chosen = roofline.Prediction(loader(0), compute("fp32"), loader_rate=1e9, compute_rate=1.0)
    where = {"device": prepared.device, "seed": 0}
    weighed = chosen_setting.weigh_compile(
        lambda work, *args: prepared.measure(work, *args, **where), spec, prepared, chosen, plain
    )
    # compiling takes seconds; the plain step starts in milliseconds
    assert weighed["once_seconds"] > 0.5
    assert weighed["longest_samples"] == len(prepared.task.train)  # one epoch
    assert weighed["kept"] is (
        weighed["samples"] is not None and weighed["samples"] <= weighed["longest_samples"]
    )
    text = compile_text(weighed, batch=64)
    assert text.startswith(
        f"torch.compile measured once: {weighed['once_seconds']:.1f} s to compile"
    )
    assert ("is fixed off" in text) is not weighed["kept"]
    assert not weighed["kept"]  # a few milliseconds a step cannot win back seconds within 16 steps

    # Where the loader holds the chosen setting, a faster step saves nothing: on a GPU host the
    # compile is not measured at all (nothing runs: the device here is only named).
    input_bound = roofline.Prediction(loader(4), compute("fp32"), loader_rate=1.0, compute_rate=2.0)
    calls = []
    gpu_host = dataclasses.replace(prepared, device=torch.device("cuda"))
    skipped = chosen_setting.weigh_compile(calls.append, spec, gpu_host, input_bound, plain)
    longest = len(prepared.task.train)
    assert skipped == {"kept": False, "unmeasured": "input", "longest_samples": longest}
    assert calls == []
    assert compile_text(skipped, batch=64).startswith(
        "torch.compile fixed off unmeasured: the chosen setting is input-bound"
    )


def test_the_probe_measures_each_loader_once_per_workers_and_pinning_at_the_largest_prefetch() -> (
    None
):
    from autotune.search.space import Choices

    space = {
        "data_on_device": Choices((False,)),
        "num_workers": Choices((8, 0, 2)),
        "prefetch_factor": Choices((2, 4)),
        "pin_memory": Choices((False, True)),
    }
    settings = roofline.loader_settings(loader_settings(space))
    assert [(s["num_workers"], s["pin_memory"], s["prefetch_factor"]) for s in settings] == [
        (0, False, None),
        (0, True, None),
        (2, False, 4),
        (2, True, 4),
        (8, False, 4),
        (8, True, 4),
    ]
    # the training set on the device first, once: it has no workers to wait for
    space["data_on_device"] = Choices((False, True))
    settings = roofline.loader_settings(loader_settings(space))
    assert settings[0] == {
        "data_on_device": True,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
    }
    assert len(settings) == 7 and not any(s["data_on_device"] for s in settings[1:])
    # pinning is measured at the worker counts whose DataLoader came close to the fastest
    # DataLoader's: a gather on the device, far faster, is no DataLoader to compare with
    rates_of = {(True, 0): 90_000.0, (False, 0): 900.0, (False, 2): 1_900.0, (False, 8): 2_000.0}
    asked: list[int] = []

    def measure(indices: list[int]) -> dict[int, float]:
        asked.extend(indices)
        return {
            i: rates_of.get((settings[i]["data_on_device"], settings[i]["num_workers"]), 2_000.0)
            for i in indices
        }

    screening.screened_loaders(settings, measure)
    pinned = [settings[i]["num_workers"] for i in asked if settings[i]["pin_memory"]]
    assert pinned == [2, 8]


def test_loaders_measured_in_turn_run_alone_and_stop_once_one_outpaces_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While one loader setting is timed no other setting's workers are alive (side by side they
    would refill their queues on the same cores); once one delivers enough, the rest are left."""
    from autotune.runners import descendants

    task = paced.make(load_seconds=paced.LOAD_SECONDS / 4, compute_seconds=0.0)
    alive: dict[str, set[int]] = {}
    window = rates._LoaderSession.window
    # processes this one had already (a fork server, a resource tracker) are not loader workers
    before = set(descendants.children(os.getpid()))

    def counted(self: rates._LoaderSession) -> float | None:
        key = f"w{self.config.num_workers}"
        alive.setdefault(key, set()).add(len(set(descendants.children(os.getpid())) - before))
        return window(self)

    monkeypatch.setattr(rates._LoaderSession, "window", counted)
    loaders = {f"w{w}": config(**loader(w)) for w in (1, 2)}
    in_turn = rates.measure_loaders_in_turn(task, loaders, device=CPU, seed=1)
    assert alive == {"w1": {1}, "w2": {2}}
    assert in_turn["w2"].samples_per_second > 1.4 * in_turn["w1"].samples_per_second
    alive.clear()
    rates.measure(task, loaders, {}, device=CPU, seed=1)  # side by side: both sets alive
    assert alive == {"w1": {3}, "w2": {3}}

    enough = in_turn["w1"].samples_per_second / 2
    stopped = rates.measure_loaders_in_turn(task, loaders, enough, device=CPU, seed=1)
    assert stopped["w1"].samples_per_second and stopped["w2"].samples_per_second is None
    assert "not measured" in stopped["w2"].reason
    # a loader with no workers loads between the steps: however fast, workers may still pay
    serial = {"w0": config(**loader(0)), **loaders}
    after = rates.measure_loaders_in_turn(task, serial, enough, device=CPU, seed=1)
    assert after["w0"].samples_per_second > enough and after["w1"].samples_per_second
    assert after["w2"].samples_per_second is None


def test_checkpointing_is_fixed_off_only_where_the_largest_micro_batch_fits_without_it() -> None:
    """Checkpointing only recomputes at a batch that fits: the probe's hungriest peak, scaled to
    the space's largest micro-batch, decides it against the device's memory."""
    from autotune.spec.study_file import from_mapping

    def space(**domains):
        raw = {"batch_size": [128, 512], "checkpointing": [False, True], **domains}
        return from_mapping(
            {"task": "digits", "target": {"metric": "accuracy", "value": 0.9}, "space": raw},
            path=Path("fit.yaml"),
        ).space

    gib = 2**30
    rates_at_128 = [gib, 3 * gib]  # two settings' peaks at batch 128
    fit = roofline.checkpointing_fit(space(), rates_at_128, batch=128, device_bytes=80 * gib)
    # 3 GiB at 128 is 12 GiB at 512
    assert fit == {
        "largest_batch": 512,
        "predicted_bytes": 12 * gib,
        "device_bytes": 80 * gib,
        "fits": True,
    }
    assert not roofline.checkpointing_fit(space(), rates_at_128, batch=128, device_bytes=14 * gib)[
        "fits"
    ]  # 12 GiB is more than 80% of 14
    ranged = space(batch_size={"low": 64, "high": 1024})
    assert (
        roofline.checkpointing_fit(ranged, rates_at_128, batch=128, device_bytes=30 * gib)[
            "largest_batch"
        ]
        == 1024
    )
    # nothing to decide: no choice, no off among it, a setting out of memory, no device figure
    for undecided, peaks, device in [
        (space(checkpointing=True), rates_at_128, 80 * gib),
        (space(checkpointing=[True, 0.5]), rates_at_128, 80 * gib),
        (space(), [*rates_at_128, None], 80 * gib),
        (space(), rates_at_128, None),
    ]:
        assert roofline.checkpointing_fit(undecided, peaks, batch=128, device_bytes=device) is None
    assert checkpointing_text(fit) == (
        "Activation checkpointing fixed off: the largest micro-batch (512) should peak at 12.0 GiB "
        "without it, of the device's 80.0 GiB, and it only recomputes"
    )
    # the training set kept on the device adds its copy: 12 GiB fits in 80% of 16, 14 does not
    assert roofline.checkpointing_fit(space(), rates_at_128, batch=128, device_bytes=16 * gib)[
        "fits"
    ]
    with_set = roofline.checkpointing_fit(
        space(), rates_at_128, batch=128, device_bytes=16 * gib, set_bytes=2 * gib
    )
    assert with_set["predicted_bytes"] == 14 * gib and not with_set["fits"]
    assert checkpointing_text(with_set) == (
        "Activation checkpointing stays in the search: the largest micro-batch (512) should peak "
        "at 14.0 GiB without it (2.0 GiB of it the training set kept on the device), of the "
        "device's 16.0 GiB"
    )


def test_the_training_set_s_copy_counts_where_the_chosen_setting_keeps_one_on_the_device() -> None:
    """The gather's measured peak is the set's copy (and a batch): counted for a setting that keeps
    it there, not for one with a DataLoader; nothing where no gather was measured (a CPU)."""
    outcome = {
        "loader_rates": [
            {**loader(4), "peak_memory_bytes": 3_000},  # a batch, copied
            {"data_on_device": True, "num_workers": 0, "peak_memory_bytes": 5_000_000},
        ]
    }
    on_device = {"data_on_device": True, "num_workers": 0}
    assert figures.set_bytes(outcome, on_device) == 5_000_000
    assert figures.set_bytes(outcome, loader(4)) == 0
    cpu = {"loader_rates": [{"data_on_device": True, "peak_memory_bytes": None}]}
    assert figures.set_bytes(cpu, on_device) == 0
    assert figures.set_bytes({}, on_device) == 0


class Bursty(torch.utils.data.Dataset):
    """`dataset`, with one batch in about seven taking fifteen times as long to load."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices):
        import random
        import time

        time.sleep(0.03 if random.random() < 0.15 else 0.002)
        return [self[i] for i in indices]

    def __getitem__(self, index):
        return self.dataset.inputs[index], self.dataset.labels[index]


def test_a_setting_held_by_its_loader_is_timed_on_an_empty_queue_its_queued_batches_dropped() -> (
    None
):
    """Its workers fill their queue while it starts (a GPU's first steps take seconds); a window
    on those batches would time the step, not the loader. They are dropped untimed, not trained
    (training them took seconds on a GPU), then a step a worker, and the window times the
    loader."""
    load_seconds, batch, workers = 2e-3, 32, 2
    task = paced.make(load_seconds=load_seconds, compute_seconds=0.5e-3)  # the step 2x faster
    deep = config(**{**loader(workers), "prefetch_factor": 8}, batch_size=batch)
    session = throughput._EndToEndSession(task, deep, device=CPU, seed=1, window_steps=20)
    try:
        time.sleep(1.0)  # the queue fills: 2 x 8 batches, and one part-way
        trained, taken = [], []
        steps, batches = session._steps, session.batches

        def counted_steps(count):
            trained.append(count)
            return steps(count)

        def counted_batches():
            for one in batches:
                taken.append(1)
                yield one

        session._steps = counted_steps
        session.batches = counted_batches()
        speed = session.window()
    finally:
        session.close()
    # 17 batches dropped and 2 trained before the window's 20: none of the queue trained
    assert (len(taken), trained) == (17 + 2 + 20, [2, 20])
    assert speed == pytest.approx(workers / load_seconds, rel=0.25)


def test_a_setting_held_by_many_workers_is_timed_in_windows_of_several_of_their_bursts() -> None:
    """16 workers started together deliver 16 batches at once, then none until the next round;
    windows of 10 steps fell within or between such bursts and measured 20% below the loader,
    never agreeing. Windows of several bursts measure the loader end to end, and agree."""
    # no set step cost: the step is the loop's own, well ahead of the loader even where that
    # takes milliseconds (a slow 2-core machine's took 3 ms a step)
    task = paced.make(load_seconds=8e-3, compute_seconds=0.0)
    many = config(**{**loader(16), "prefetch_factor": 2}, batch_size=16)
    alone = rates.measure(task, {"loader": many}, {}, device=CPU, seed=1)["loader"]
    ran = throughput.measure_in_turn(task, {"many": many}, device=CPU, seed=1)["many"]
    assert alone.samples_per_second == pytest.approx(16 / 8e-3, rel=0.1)
    assert ran.samples_per_second == pytest.approx(alone.samples_per_second, rel=0.07)
    assert ran.spread <= throughput.MAX_SPREAD and ran.windows < throughput.MAX_ROUNDS


def test_a_setting_held_by_its_step_keeps_short_windows_its_queue_full() -> None:
    """Where the loader is well ahead of the step (predicted apart), the queue stays full and
    the step never waits: short windows time it, at the step's rate."""
    # the loader 16x ahead; a step long beside the loop's own milliseconds
    task = paced.make(load_seconds=1e-3, compute_seconds=4e-3)
    ahead = config(**{**loader(4), "prefetch_factor": 2}, batch_size=16)
    ran = throughput.measure_in_turn(task, {"k": ahead}, None, {"k"}, device=CPU, seed=1)["k"]
    assert ran.window_steps == throughput.WINDOW_STEPS
    assert ran.samples_per_second == pytest.approx(1 / 4e-3, rel=0.15)


def test_a_loader_whose_windows_never_agree_is_timed_a_bounded_number_of_windows() -> None:
    """Windows that disagree however many are timed (batches loaded in bursts) stop at
    rates.LOADER_ROUNDS, the figure kept with its spread."""
    task = paced.make(load_seconds=0.0, compute_seconds=0.0)
    bursty = dataclasses.replace(task, train=Bursty(task.train))
    rate = rates.measure_loaders_in_turn(bursty, {"w1": config(**loader(1))}, device=CPU, seed=1)
    assert rate["w1"].windows == rates.LOADER_ROUNDS < throughput.MAX_ROUNDS
    assert rate["w1"].spread > throughput.MAX_SPREAD and rate["w1"].samples_per_second > 0


def test_a_screened_probe_predicts_over_the_compute_settings_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more compute settings than screening.SCREEN_ABOVE the probe measures them in stages
    (each in one process) and predicts over those measured; the report says it screened."""
    from autotune.probe import run
    from autotune.probe.model import screening
    from autotune.search.space import Choices
    from autotune.spec import study_file
    from autotune.study import preparation

    monkeypatch.setattr(screening, "SCREEN_ABOVE", 1)
    path = write_study(tmp_path, probe="joint")
    raw = yaml.safe_load(path.read_text())
    # one micro-batch: the chosen setting is not measured again at another (screening is not)
    raw["space"].update(batch_size=128)
    path.write_text(yaml.safe_dump(raw))
    spec = study_file.load(path)
    prepared = preparation.prepare(spec)
    # pinning a choice, as on a GPU (a CPU loader pins nothing whatever it says)
    prepared = dataclasses.replace(
        prepared, space=prepared.space.replace("pin_memory", Choices((False, True)))
    )
    computes = roofline.compute_settings(prepared.space)
    stages, loader_calls = [], []
    measure = prepared.measure

    def counted(work, *args, **kwargs):
        if work is throughput.stop_rounds_at or any(c.batch_size != 128 for c in args[0].values()):
            # the chosen setting at the space's other batch (probe/chosen_setting.py)
            return measure(work, *args, **kwargs)
        if work is rates.measure_in_groups:
            stages.append(len(args[0]))
        if work is rates.measure_loaders_in_turn:
            loader_calls.append(sorted((c.num_workers, c.pin_memory) for c in args[0].values()))
        return measure(work, *args, **kwargs)

    outcome = run.run(spec, dataclasses.replace(prepared, measure=counted))
    assert outcome["screened_from"] == len(computes) > 1
    measured = {(r["precision"], r["channels_last"]) for r in outcome["compute_rates"]}
    assert stages and sum(stages) == len(outcome["compute_rates"])
    # every worker count unpinned, then pinned only near the fastest: not all three again
    assert loader_calls[0] == [(0, False), (2, False), (4, False)]
    assert len(loader_calls) == 2 and 1 <= len(loader_calls[1]) < 3
    assert all(pin for _, pin in loader_calls[1])
    assert len(outcome["loader_rates"]) == 3 + len(loader_calls[1])
    assert (outcome["chosen"]["precision"], outcome["chosen"]["channels_last"]) in measured
    assert f"compute settings measured apart (screened from {len(computes)})" in (describe(outcome))


def test_a_training_set_that_does_not_fit_on_the_device_is_left_out_by_the_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its copy runs out of memory as the probe measures it: a result, not a failure. No trial
    keeps the set on the device, and the report says why."""
    path = write_study(
        tmp_path, probe="joint", task="tests.tasks:too_large_for_the_device", trials=2
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(data_on_device=[True, False], num_workers=[0, 2], precision="fp32")
    raw["prune"] = "none"  # each trial trains to its end
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    study = load(path)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert not any(t.user_attrs["config"]["data_on_device"] for t in study.trials)
    on = [r for r in study.user_attrs["probe"]["loader_rates"] if r["data_on_device"]]
    assert len(on) == 1 and on[0]["oom"] and "150.00 GiB" in on[0]["reason"]
    assert "Out of memory as the probe measured it, so left out: data on the device (" in out


def test_where_the_gather_on_the_device_far_outpaces_every_step_no_dataloader_is_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DataLoader feeds the step no faster than it runs: beside a gather that costs nothing,
    measuring one would only spend the probe's time. The study trains with its data there."""
    path = write_study(tmp_path, probe="joint", task="tests.tasks:paced_on_device")
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(data_on_device=[True, False], batch_size=128, precision="bf16")
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    study = load(path)
    outcome = study.user_attrs["probe"]
    assert [r["data_on_device"] for r in outcome["loader_rates"]] == [True]
    gathered = outcome["gather_outpaced"]
    assert gathered["gather"] >= screening.GATHER_OUTPACES * gathered["step"]
    assert outcome["chosen"]["data_on_device"] is True
    assert study.trials[0].user_attrs["config"]["data_on_device"] is True
    assert "No DataLoader measured: the training set on the device was gathered at " in out
