"""autotune.tune: the Python API, with a model defined here and with a plain objective function."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import autotune
from autotune.errors import AutotuneError, SpecError
from autotune.record.schema import measured
from autotune.report.results import trial_records
from autotune.report.text import render
from autotune.search.knob import DDP_NAMES
from autotune.search.space import KNOBS

SPACE = {
    "lr": {"low": 0.02, "high": 0.3, "log": True},
    "scheduler": ["constant", "cosine"],
    "batch_size": [16, 32],
    "accumulation_steps": 1,
    "num_workers": 0,
    "precision": "fp32",
}
BUDGET = {"trials": 3, "max_epochs": 4, "max_seconds": 10, "eval_every": 0.5}


def rings(n: int, seed: int) -> TensorDataset:
    """Two classes: points inside or outside a circle, which a linear model cannot separate."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    return TensorDataset(x, (x.norm(dim=1) > 0.6).long())


class RingNet(nn.Module):
    """The model under tuning, defined here and nowhere else."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def stored(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in optuna.load_study(study_name=name, storage=storage).get_trials()
        if t.state.is_finished()
    ]


def test_tunes_a_model_defined_in_this_file_and_resumes(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'rings.db'}"
    kwargs = dict(
        model=RingNet,
        train=rings(1024, 0),
        val=rings(512, 1),
        target=0.9,
        name="rings",
        storage=storage,
        space={**SPACE, "params": {"width": [8, 32]}},
        confirm={"top": 1, "runs": 3},  # the fewest runs that can resolve a lead
    )
    # 8 epochs: at these rates a run may need 5.5 to reach 0.9 (the winner's run on a fresh seed)
    # No wall-clock cap that a busy machine reaches (10 s did, on two loaded cores: the
    # confirmation's runs were cut short, the lead unresolved, the baseline kept): the epochs
    # decide where a run stops.
    budget = {**BUDGET, "max_epochs": 8, "max_seconds": 600}
    summary = autotune.tune(**kwargs, budget=budget)

    assert summary.counts.total == 3 and summary.best is not None
    assert summary.best.metric >= 0.9 and summary.best.source == "confirmed"
    # DistributedDataParallel's knobs only for a study on several devices
    assert list(summary.best.params) == [*(k for k in KNOBS if k not in DDP_NAMES), "width"]
    first = {t.number: t.params for t in stored(storage, "rings")}
    assert {p["width"] for p in first.values()} <= {8, 32}

    # the same call with a bigger budget
    again = autotune.tune(**kwargs, budget={**budget, "trials": 5})
    after = {t.number: t.params for t in stored(storage, "rings")}
    assert again.counts.total == 5 and {n: after[n] for n in first} == first


def test_tunes_a_plain_objective_with_params_of_its_own(tmp_path: Path) -> None:
    """The function gets the knobs its caller names and its own parameters, and is timed by its
    own word; knobs it was not given are neither searched nor reported."""
    calls: list[tuple[dict, int]] = []

    def objective(config: dict, seed: int) -> tuple[float, float]:
        calls.append((config, seed))
        # A made-up but deterministic response: bigger batches and wider layers are faster here,
        # and the accuracy needs a learning rate near 0.1.
        seconds = (
            10.0 / config["batch_size"]
            + 1.0 / config["width"]
            + (0.5 if config["activation"] == "tanh" else 0)
        )
        return seconds, 1.0 - abs(math.log10(config["lr"] / 0.1))

    space = {
        **SPACE,
        "params": {"width": {"low": 4, "high": 64, "log": True}, "activation": ["relu", "tanh"]},
    }
    summary = autotune.tune(
        objective=objective,
        target=0.7,
        metric="score",
        name="made_up",
        storage=f"sqlite:///{tmp_path / 'made_up.db'}",
        space=space,
        budget={**BUDGET, "trials": 12},
        confirm={"top": 2, "runs": 4},  # two candidates share the rule's level: 4 runs resolve
    )

    trials = stored(f"sqlite:///{tmp_path / 'made_up.db'}", "made_up")
    assert len(trials) == 12
    named = [k for k in KNOBS if k in SPACE]
    for config, seed in calls:
        assert set(config) == {*named, "width", "activation"} and isinstance(config["width"], int)
        assert 4 <= config["width"] <= 64 and config["activation"] in ("relu", "tanh") and seed >= 0
    assert {name for t in trials for name in t.params} == {
        "lr",
        "scheduler",
        "batch_size",
        "width",
        "activation",
    }
    best = summary.best
    assert list(best.params) == [*named, "width", "activation"] and list(
        summary.baseline.params
    ) == list(best.params)
    records = trial_records(trials, knobs=summary.knobs)
    table = render(summary, records).split("Fastest trials")[1].splitlines()[1].split()
    assert table == [
        "trial",
        "seconds",
        "score",  # no epochs or samples/s: a function reports neither
        "lr",
        "scheduler",
        "batch_size",
        "accum",
        "num_workers",
        "precision",
        "width",
        "activation",
    ]
    assert best is not None and best.metric >= 0.7
    feasible = [t for t in trials if measured(t)["reached"]]
    assert best.time_to_target == pytest.approx(
        min(measured(t)["time_to_target"] for t in feasible)
    )
    assert summary.as_dict()["target"] == {"metric": "score", "value": 0.7}
    assert len(calls) == 12 + 4 * 3  # every trial, then 4 runs of the top 2 and of the baseline


def test_an_objective_gets_every_knob_when_its_caller_names_a_preset(tmp_path: Path) -> None:
    seen: list[dict] = []

    def objective(config: dict) -> tuple[float, float]:
        seen.append(config)
        return 1.0 / config["batch_size"], 0.95

    autotune.tune(
        objective=objective,
        target=0.9,
        name="all",
        storage=f"sqlite:///{tmp_path / 'all.db'}",
        space={"preset": "default", "num_workers": 0},
        budget={**BUDGET, "trials": 2},
        confirm={"top": 0},
    )
    assert seen and all(set(config) == set(KNOBS) for config in seen)


def test_an_objective_study_exports_what_it_tuned_and_refuses_a_trainer_format(
    tmp_path: Path,
) -> None:
    from autotune import export

    def objective(config: dict) -> tuple[float, float]:
        return 1.0 / config["batch_size"], 0.95

    summary = autotune.tune(
        objective=objective,
        target=0.9,
        name="some",
        storage=f"sqlite:///{tmp_path / 'some.db'}",
        space={"batch_size": [16, 64]},
        baseline={"lr": 0.05},
        budget={**BUDGET, "trials": 3},
        confirm={"top": 0},
    )
    assert summary.knobs == ("lr", "batch_size")
    assert list(json.loads(export.render(summary, "json"))) == ["lr", "batch_size"]
    with pytest.raises(
        autotune.errors.AutotuneError, match="reads only lr, batch_size of autotune's knobs"
    ):
        export.render(summary, "lightning")


def test_a_study_tune_ran_is_reported_and_exported_from_its_storage_without_a_study_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.cli import main

    storage = f"sqlite:///{tmp_path / 'rings.db'}"
    summary = autotune.tune(
        model=RingNet,
        train=rings(1024, 0),
        val=rings(512, 1),
        target=0.9,
        name="rings",
        storage=storage,
        space=SPACE,
        budget=BUDGET,
        confirm={"top": 1, "runs": 1},
        first_trial="sampled",  # this seed's sampled trials reach the target
        probe="none",  # this is about reading the storage, not the probe
    )
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--storage", storage, "--study", "rings", "--json"]) == 0
    # what tune() returned
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(summary.as_dict()))
    assert main(["export", "--storage", storage, "--study", "rings", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["lr"] == summary.best.params["lr"]

    before = (tmp_path / "rings.db").read_bytes()
    for argv, said in (
        (["report", "--storage", storage, "--study", "ring"], "no study named 'ring' in"),
        (["report", "--storage", storage], "give a study file, or --storage URL with --study NAME"),
        (["export", "--format", "json", "--study", "rings"], "give a study file, or --storage URL"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert (tmp_path / "rings.db").read_bytes() == before

    # A study file written afterwards to reach it, naming another task: read, and told so.
    (tmp_path / "rings.yaml").write_text(
        f"name: rings\ntask: digits\ntarget: {{metric: accuracy, value: 0.9}}\n"
        f"storage: {storage}\nbudget: {{max_epochs: 4, max_seconds: 10, eval_every: 0.5}}\n"
    )
    assert main(["report", "rings.yaml"]) == 0
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "autotune: notice: rings.yaml: differs from the stored study 'rings' in task: "
        )
        and "digits" in err
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_tune_marks_the_running_trial_and_says_how_to_go_on(
    tmp_path: Path, signum: int
) -> None:
    """As `autotune run` does: the trial stopped is marked interrupted with its reason and queued
    again, the finished one kept, and one line says where they are and how to go on."""
    marker = tmp_path / "second-trial-started"
    script = tmp_path / "tuning.py"
    script.write_text(
        "import pathlib, time\nimport autotune\ncalls = []\n\n"
        "def objective(config):\n"
        "    calls.append(config)\n"
        "    if len(calls) == 2:\n"
        f"        pathlib.Path({str(marker)!r}).touch()\n"
        "        time.sleep(120)\n"
        "    return 1.0 / config['batch_size'], 0.95\n\n"
        "autotune.tune(objective=objective, target=0.9, name='stopped', "
        "space={'batch_size': [16, 32]},\n"
        "              budget={'trials': 4}, confirm={'top': 0})\n"
    )
    run = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert run.poll() is None and time.monotonic() < deadline, (
            run.stderr.read() if run.poll() is not None else "slow"
        )
        time.sleep(0.05)
    run.send_signal(signum)
    _, err = run.communicate(timeout=60)
    assert run.returncode != -signal.SIGTERM, err  # not killed by the signal's default action
    name = signal.Signals(signum).name
    assert (
        f"autotune: interrupted ({name}); every finished trial is saved in sqlite:///stopped.db; "
        "call tune() again with the same name and storage to go on"
    ) in err, err
    trials = optuna.load_study(
        study_name="stopped", storage=f"sqlite:///{tmp_path / 'stopped.db'}"
    ).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]
    assert trials[1].user_attrs["reason"] == f"interrupted: stopped by {name}"


def test_a_changed_study_is_told_what_tune_takes_to_go_on(tmp_path: Path) -> None:
    """Not the command line's --allow-changes or the study file's name: key: tune()'s own
    arguments."""
    storage = f"sqlite:///{tmp_path / 'changed.db'}"
    kwargs = dict(
        objective=lambda c: (1.0, 0.95),
        name="changed",
        storage=storage,
        space=SPACE,
        budget={**BUDGET, "trials": 1},
        confirm={"top": 0},
    )
    autotune.tune(target=0.9, **kwargs)
    with pytest.raises(AutotuneError) as refused:
        autotune.tune(target=0.8, **kwargs)
    message = str(refused.value)
    assert (
        "allow_changes=True" in message and "name=" in message and "--allow-changes" not in message
    )
    assert autotune.tune(target=0.8, allow_changes=True, **kwargs).target.value == 0.8


def test_an_objective_that_calls_sys_exit_fails_its_trial_only(tmp_path: Path) -> None:
    """sys.exit in the function ends its trial (FAILED "SystemExit: 3"), not the caller's
    program."""

    def objective(config: dict) -> object:
        if config["scheduler"] == "cosine":
            sys.exit(3)
        return 1.0, 0.99

    storage = f"sqlite:///{tmp_path / 'exits.db'}"
    autotune.tune(
        objective=objective,
        target=0.9,
        name="exits",
        storage=storage,
        space=SPACE,
        budget={**BUDGET, "trials": 4},
        confirm={"top": 0},
    )
    trials = stored(storage, "exits")
    assert len(trials) == 4 and not any(t.state.name == "RUNNING" for t in trials)
    exited = [t for t in trials if t.params.get("scheduler") == "cosine"]
    assert exited, "the sampler never tried cosine; pick another seed"
    assert all(
        t.state.name == "FAIL" and t.user_attrs["reason"].startswith("SystemExit: 3")
        for t in exited
    )


def test_an_objective_that_raises_or_returns_nonsense_fails_its_trial_only(tmp_path: Path) -> None:
    def objective(config: dict) -> object:
        if config["batch_size"] == 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return "fast" if config["scheduler"] == "cosine" else (1.0, 0.99)

    storage = f"sqlite:///{tmp_path / 'odd.db'}"
    autotune.tune(
        objective=objective,
        target=0.9,
        name="odd",
        storage=storage,
        space=SPACE,
        budget={**BUDGET, "trials": 8},
        confirm={"top": 0},
    )
    trials = stored(storage, "odd")
    # those known to run out of memory never ran, and take no slot of the budget
    assert len([t for t in trials if "oom_bound" not in t.user_attrs]) == 8
    for t in trials:
        if t.params.get("batch_size") == 32:
            # the first one ran out of memory; later ones are known to and never run (OOM boundary)
            assert t.state.name == "PRUNED" and (
                t.user_attrs.get("oom") or "oom_bound" in t.user_attrs
            )
        elif t.params.get("scheduler") == "cosine":
            assert (
                t.state.name == "FAIL" and "the objective returned 'fast'" in t.user_attrs["reason"]
            )
        else:
            assert t.state.name == "COMPLETE" and t.value == 1.0


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="exactly one of"):
        autotune.tune(
            target=0.9,
            model=RingNet,
            objective=lambda c: (1, 1),
            train=rings(8, 0),
            val=rings(8, 1),
        )
    with pytest.raises(TypeError, match="train= and val="):
        autotune.tune(target=0.9, model=RingNet)
    with pytest.raises(
        SpecError, match=r"autotune.tune\(\): space.batchsize: .*did you mean 'batch_size'"
    ):
        autotune.tune(target=0.9, objective=lambda c: (1, 1), space={"batchsize": [8]})
    with pytest.raises(SpecError, match="space.params.depth: .*neither the task's model factory"):
        autotune.tune(
            target=0.9,
            model=RingNet,
            train=rings(8, 0),
            val=rings(8, 1),
            space={"params": {"depth": [2]}},
        )


@pytest.mark.parametrize("route", ["model", "objective"])
def test_an_accuracy_target_no_run_could_reach_is_refused_by_every_route(
    route: str, tmp_path: Path
) -> None:
    """As the study file refuses it: accuracy is a fraction, whoever measures it; nothing is
    stored."""
    given = (
        dict(model=RingNet, train=rings(64, 0), val=rings(32, 1))
        if route == "model"
        else dict(objective=lambda c: (1, 0.5))
    )
    storage = tmp_path / "refused.db"
    with pytest.raises(SpecError, match=r"target.value: got 2.0; .*accuracy is a fraction"):
        autotune.tune(target=2, name="refused", storage=f"sqlite:///{storage}", **given)
    assert not storage.exists()


def test_confirmation_re_runs_on_fresh_seeds_and_a_lucky_winner_loses_to_the_baseline(
    tmp_path: Path,
) -> None:
    """batch_size 16 is fast only on the study's own seeds (a lucky draw); on the fresh seeds of
    the confirmation it is slower than the baseline, so the baseline is what the study
    recommends."""
    seeds: list[tuple[int, int]] = []

    def objective(config: dict, seed: int) -> tuple[float, float]:
        seeds.append((config["batch_size"], seed))
        lucky = seed < 50_000  # the study's trials use seeds 0, 1, ...; fresh seeds start at 50,000
        return (0.5 if lucky else 3.0) if config["batch_size"] == 16 else 2.0, 1.0

    space = {**SPACE, "batch_size": [16, 64]}
    storage = f"sqlite:///{tmp_path / 'lucky.db'}"
    summary = autotune.tune(
        objective=objective,
        target=0.9,
        name="lucky",
        storage=storage,
        space=space,
        baseline={"batch_size": 64},
        budget={**BUDGET, "trials": 6},
        confirm={"top": 1, "runs": 3},
    )

    trials = stored(storage, "lucky")
    fastest = min(
        (t for t in trials if measured(t)["reached"]), key=lambda t: measured(t)["time_to_target"]
    )
    assert fastest.params["batch_size"] == 16 and measured(fastest)["time_to_target"] == 0.5
    fresh = [(b, s) for b, s in seeds if s >= 50_000]
    # the top trial and the baseline, 3 fresh seeds each
    assert sorted(b for b, _ in fresh) == [16] * 3 + [64] * 3
    best = summary.best
    assert best.trial is None and best.label == "baseline" and best.params["batch_size"] == 64
    assert best.time_to_target == 2.0 and summary.speedup == 1.0
    assert summary.confirmation.configs[f"trial {fastest.number}"]["median"] == 3.0


def test_fixed_schedule_judges_the_mean_final_metric_over_replicates_and_times_the_whole_schedule(
    tmp_path: Path,
) -> None:
    """A 1-epoch schedule ends over the target on the trial's own seed only (one lucky replicate):
    infeasible on the mean. A 2-epoch one ends over it on every seed: the winner, twice as fast as
    the baseline's whole 4-epoch schedule."""
    calls: list[tuple[float, int]] = []

    def objective(config: dict, seed: int) -> tuple[float, float]:
        epochs = config["schedule_epochs"]
        calls.append((epochs, seed))
        if epochs == 1:
            return 1.0, 0.97 if seed < 10**12 else 0.5  # replicates run on seed + k * 10**12
        return float(epochs), 0.95

    storage = f"sqlite:///{tmp_path / 'fixed.db'}"
    summary = autotune.tune(
        objective=objective,
        target=0.9,
        name="fixed",
        storage=storage,
        space={
            **SPACE,
            "lr": 0.1,
            "scheduler": "cosine",
            "batch_size": 16,
            "schedule_epochs": [1, 2],
        },
        objective_kind="fixed_schedule",
        budget={**BUDGET, "trials": 6},
        confirm={"top": 1, "runs": 3},
    )

    trials = [t for t in stored(storage, "fixed") if t.state == optuna.trial.TrialState.COMPLETE]
    assert {t.params["schedule_epochs"] for t in trials} == {1, 2}
    for t in trials:
        runs = measured(t)["replicates"]
        assert [r["seed"] for r in runs] == [t.user_attrs["seed"], t.user_attrs["seed"] + 10**12]
        assert t.value == pytest.approx(sum(r["train_seconds"] for r in runs) / 2)
        feasible = max(t.constraints.values()) <= 0
        assert feasible == (t.params["schedule_epochs"] == 2)
    assert summary.objective == "fixed_schedule"
    best = summary.best
    assert (
        best.params["schedule_epochs"] == 2
        and best.time_to_target == 2.0
        and best.metric == pytest.approx(0.95)
    )
    assert (
        summary.baseline.params["schedule_epochs"] == 4.0 and summary.baseline.time_to_target == 4.0
    )
    assert summary.speedup == 2.0
    assert [e for e, s in calls if s >= 50_000 and s < 10**12].count(
        4.0
    ) == 3  # the baseline's whole schedule, 3 fresh seeds
    text = render(summary, trial_records(stored(storage, "fixed")))
    assert "Fastest trials (whole schedules, mean of 2 runs each)" in text
    assert (
        "Trains its whole 2-epoch schedule to a mean accuracy >= 0.9 in 2.00 s "
        "(median of 3 runs, range 2.00-2.00 s); the baseline's 4-epoch schedule takes 4.00 s"
    ) in text and text.endswith(
        "2.00x faster (90% interval 2.00-2.00x; rank test p = 0.050 over 3 runs each, at most "
        "0.050 resolves it)."
    )


def test_fixed_schedule_runs_train_every_step_of_their_schedule(tmp_path: Path) -> None:
    """With a real training loop: no run stops at the target, the study's or the confirmation's."""
    storage = f"sqlite:///{tmp_path / 'whole.db'}"
    summary = autotune.tune(
        model=RingNet,
        train=rings(1024, 0),
        val=rings(512, 1),
        target=0.8,
        name="whole",
        storage=storage,
        space={**SPACE, "schedule_epochs": [1, 2], "fused_optimizer": False},
        objective_kind="fixed_schedule",
        budget={**BUDGET, "trials": 2},
        confirm={"top": 1, "runs": 1},
        probe="none",
        first_trial="sampled",  # this seed's sampled trials reach the target
    )
    for t in stored(storage, "whole"):
        result = measured(t)
        steps = int(
            t.user_attrs["config"]["schedule_epochs"] * 1024 // t.user_attrs["config"]["batch_size"]
        )
        assert result["stop_reason"] == "max_epochs" and result["optimizer_steps"] == steps
        assert len(result["replicates"]) == 2
    confirmation = summary.confirmation
    assert confirmation is not None and all(
        r["stop_reason"] == "max_epochs"
        for r in optuna.load_study(study_name="whole", storage=storage).user_attrs["confirmation"][
            "runs"
        ]
    )


def test_a_first_run_that_beats_the_best_gets_more_seeds_and_a_lucky_one_loses_on_them(
    tmp_path: Path,
) -> None:
    """batch_size 16 is fast only on a trial's own seed. Alone, its lucky run wins the study;
    with replicates: 3 it beats the best on its first run, so it runs two more seeds and its
    mean loses to batch_size 64."""

    def objective(config: dict, seed: int) -> tuple[float, float]:
        if config["batch_size"] == 16:
            return (0.5 if seed < 10**12 else 3.0), 1.0
        return 2.0, 1.0

    space = {**SPACE, "batch_size": [16, 64]}
    storage = f"sqlite:///{tmp_path / 'contenders.db'}"
    common = dict(
        objective=objective,
        target=0.9,
        storage=storage,
        space=space,
        budget={**BUDGET, "trials": 6},
        confirm={"top": 0},
    )
    lucky = autotune.tune(**common, name="one_seed")
    assert lucky.best.params["batch_size"] == 16 and lucky.best.time_to_target == 0.5

    summary = autotune.tune(**common, name="three_seeds", replicates=3)
    trials = [
        t for t in stored(storage, "three_seeds") if t.state == optuna.trial.TrialState.COMPLETE
    ]
    sixteen = [t for t in trials if t.params["batch_size"] == 16]
    assert sixteen
    for t in sixteen:
        assert [r["seed"] for r in measured(t)["replicates"]] == [
            t.user_attrs["seed"] + k * 10**12 for k in range(3)
        ]
        assert t.value == pytest.approx((0.5 + 3.0 + 3.0) / 3)
    best = summary.best
    assert best.params["batch_size"] == 64 and best.time_to_target == 2.0
    assert all(len(measured(t).get("replicates") or [None]) in (1, 3) for t in trials)
