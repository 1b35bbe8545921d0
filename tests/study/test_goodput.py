"""The goodput search: a trial timed by the samples its maths needs and the fastest systems
setting in the probe's table; the systems-only mode, which leaves the maths as the baseline's."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune.probe import plan
from autotune.probe.model import goodput
from autotune.probe.model.figures import table_entries
from autotune.record import derived, objectives, schema
from autotune.search.space import LOADER_KNOBS, Choices, Space, complete, formats_for
from autotune.train.config import Limits, TrialConfig, TrialResult
from autotune.train.loader import endless
from autotune.train.tasks import load_task
from autotune.train.training import build, seed_everything
from tests.study.test_study import in_repo, load, run_cli, write_study  # noqa: F401 (in_repo: a fixture)

SPACE = Space(
    domains=(
        ("batch_size", Choices((16, 32, 64, 128))),
        ("accumulation_steps", Choices((1, 2, 4))),
        ("precision", Choices(("fp32", "bf16"))),
        ("num_workers", Choices((0,))),
        ("prefetch_factor", Choices((2,))),
        ("pin_memory", Choices((False,))),
        ("channels_last", Choices((False, True))),
        ("compile", Choices((False,))),
        ("cudnn_benchmark", Choices((False,))),
        ("tf32", Choices((False,))),
        ("fused_optimizer", Choices((False,))),
        ("checkpointing", Choices((False,))),
    )
)
LOADER = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False}
MATHS = {
    "lr": 0.1,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 2,
    "precision": "fp32",
    **LOADER,
    "channels_last": False,
    "compile": False,
    "cudnn_benchmark": False,
}


def entry(
    batch: int,
    speed: float | None,
    *,
    precision: str = "fp32",
    fixed: float = 0.5,
    channels_last: bool = False,
    oom: bool = False,
) -> goodput.Entry:
    settings = {
        "batch_size": batch,
        "precision": precision,
        **LOADER,
        "channels_last": channels_last,
        "compile": False,
        "cudnn_benchmark": False,
    }
    return goodput.Entry(settings, None if speed is None else goodput.Speed(speed, fixed), oom=oom)


def test_a_trial_is_named_by_the_split_of_its_effective_batch_that_trains_soonest() -> None:
    table = goodput.Table(
        [entry(16, 1000), entry(32, 1800), entry(64, 3000), entry(128, 2500)], batch_norm=False
    )
    config, speed = table.fastest(MATHS, SPACE, samples=6000)
    # 64 = 64 x 1 is the fastest of 16 x 4, 32 x 2 and 64 x 1; 128 does not divide into 64
    assert (config["batch_size"], config["accumulation_steps"], speed.samples_per_second) == (
        64,
        1,
        3000,
    )
    assert speed.seconds(6000) == pytest.approx(0.5 + 2.0)
    assert {k: config[k] for k in ("lr", "scheduler", "precision")} == {
        "lr": 0.1,
        "scheduler": "constant",
        "precision": "fp32",
    }


def test_with_batch_norm_the_micro_batch_is_maths_and_only_the_format_is_chosen() -> None:
    table = goodput.Table(
        [entry(32, 1800), entry(64, 3000), entry(32, 2000, channels_last=True)], batch_norm=True
    )
    config, speed = table.fastest(MATHS, SPACE, samples=6000)
    assert (config["batch_size"], config["accumulation_steps"], config["channels_last"]) == (
        32,
        2,
        True,
    )
    assert speed.samples_per_second == 2000


def test_a_large_fixed_cost_loses_to_a_slower_setting_for_few_samples() -> None:
    table = goodput.Table(
        [entry(32, 1000, fixed=0.1), entry(32, 1500, fixed=10.0, channels_last=True)],
        batch_norm=True,
    )
    few, _ = table.fastest(MATHS, SPACE, samples=1000)
    many, _ = table.fastest(MATHS, SPACE, samples=100_000)
    assert (few["channels_last"], many["channels_last"]) == (False, True)


def test_the_step_time_model_fills_in_between_measured_micro_batches_only() -> None:
    # seconds per step = 0.01 + 0.001 x batch: speed(16) = 16 / 0.026, speed(64) = 64 / 0.074
    table = goodput.Table([entry(16, 16 / 0.026), entry(64, 64 / 0.074)], batch_norm=False)
    assert table.speed_of({**MATHS, "batch_size": 32}).samples_per_second == pytest.approx(
        32 / 0.042
    )
    # past the largest measured: no extrapolation
    assert table.speed_of({**MATHS, "batch_size": 128}) is None
    assert goodput.fit_step_time([(16, 16 / 0.026), (64, 64 / 0.074)]) == pytest.approx(
        (0.01, 0.001)
    )


def test_running_out_of_memory_rules_out_larger_micro_batches_and_is_learned_per_precision() -> (
    None
):
    table = goodput.Table(
        [
            entry(16, 1000),
            entry(32, None, oom=True),
            entry(64, 3000),
            entry(16, 1500, precision="bf16"),
            entry(64, 4000, precision="bf16"),
        ],
        batch_norm=False,
    )
    assert table.largest_fitting() == {"fp32": 64, "bf16": 64}
    # between 16 and 64, but 32 ran out of memory
    assert table.speed_of({**MATHS, "batch_size": 48}) is None
    effective_64 = {**MATHS, "batch_size": 64, "accumulation_steps": 1}
    assert table.fastest(effective_64, SPACE, samples=1000)[0]["batch_size"] == 64
    nothing_fits = goodput.Table([entry(16, None, oom=True)], batch_norm=False)
    assert nothing_fits.fastest(MATHS, SPACE, samples=1000) is None


def test_same_maths_ignores_systems_settings_but_not_the_effective_batch() -> None:
    split = {
        **MATHS,
        "batch_size": 64,
        "accumulation_steps": 1,
        "channels_last": True,
        "num_workers": 2,
    }
    assert goodput.same_maths(MATHS, split, batch_norm=False)
    assert not goodput.same_maths(MATHS, split, batch_norm=True)
    assert not goodput.same_maths(MATHS, {**MATHS, "accumulation_steps": 1}, batch_norm=False)
    assert not goodput.same_maths(MATHS, {**MATHS, "lr": 0.2}, batch_norm=False)


def run(samples: int | None, *, reached: bool = True, metric: float = 0.95) -> TrialResult:
    return TrialResult(
        reached=reached,
        time_to_target=1.0 if reached else None,
        best_metric=metric,
        train_seconds=9.0,
        epochs=1.0,
        optimizer_steps=10,
        samples_per_second=None,
        peak_memory_bytes=None,
        device_name="cpu",
        torch_version="",
        stop_reason="target" if reached else "max_epochs",
        curve=(),
        samples_to_target=samples,
    )


def test_a_goodput_trial_is_timed_by_the_prediction_for_its_mean_samples_not_its_clock() -> None:
    rules = objectives.OBJECTIVES["goodput"]

    def predict(samples: float) -> float:
        return 0.5 + samples / 1000

    outcome = rules.outcome([run(2000), run(4000)], target=0.9, predict=predict)
    # 0.5 + 3000 / 1000, whatever the clocks said
    assert outcome.value == pytest.approx(3.5) and outcome.constraint <= 0
    missed = rules.outcome(
        [run(2000), run(None, reached=False, metric=0.8)], target=0.9, predict=predict
    )
    assert missed.constraint > 0
    # a first run is a contender by its prediction: 2.5 s beats 3 s, 4.5 s does not
    assert rules.runs_for(run(2000), replicates=3, incumbent=3.0, predict=predict) == 3
    assert rules.runs_for(run(4000), replicates=3, incumbent=3.0, predict=predict) == 1


def test_goodput_seeds_are_paired_across_trials_and_others_are_not() -> None:
    """What pairing means for the seeds is the seed scheme's (tests/record/test_seeds.py)."""
    assert (
        objectives.OBJECTIVES["goodput"].paired
        and not objectives.OBJECTIVES["time_to_target"].paired
    )


def first_losses(task_name: str, config: dict, *, steps: int, seed: int = 3) -> list[float]:
    """The losses of the first `steps` optimizer steps of `config` on the task."""
    task = load_task(task_name)
    seed_everything(seed)
    training = build(
        task,
        TrialConfig.from_mapping(complete(config)),
        limits=Limits(target=math.inf, max_epochs=4, max_seconds=math.inf, eval_every=1),
        device=torch.device("cpu"),
        seed=seed,
    )
    batches = endless(training.loader)
    try:
        losses = []
        for _ in range(steps):
            losses.append(
                float(training.step([next(batches) for _ in range(config["accumulation_steps"])]))
            )
            training.scheduler.step()
        return losses
    finally:
        batches.close()


@pytest.mark.parametrize("task_name, batch_norm", [("tests.tasks:blobs", False), ("digits", True)])
def test_systems_only_settings_leave_the_training_unchanged(
    task_name: str, batch_norm: bool, tmp_path: Path
) -> None:
    """Every setting the systems-only mode would measure trains the baseline's losses, step for
    step, and so does every loader setting the probe may settle: on digits too, whose augmentation
    is drawn from each sample's key, not from the random numbers of the process that loads it."""
    space = Space(
        domains=(
            ("batch_size", Choices((16, 32, 64))),
            ("accumulation_steps", Choices((1, 2, 4))),
            ("precision", Choices(("fp32",))),
            ("num_workers", Choices((0, 1))),
            ("prefetch_factor", Choices((2,))),
            ("pin_memory", Choices((False,))),
            ("channels_last", Choices((False, True) if batch_norm else (False,))),
            ("compile", Choices((False,))),
            ("cudnn_benchmark", Choices((False,))),
            ("tf32", Choices((False,))),
            ("fused_optimizer", Choices((False, True))),
            # the digits CNN names its blocks; the blobs MLP does not
            ("checkpointing", Choices((False, True) if batch_norm else (False,))),
        )
    )
    if not batch_norm:
        # as a probe that settled on one worker leaves it
        space = space.replace("num_workers", Choices((1,)))
    baseline = {
        **MATHS,
        "lr": 0.05,
        "batch_size": 32,
        "accumulation_steps": 2,
        "schedule_epochs": None,
    }
    splits = plan.systems_only_splits(space, baseline, batch_norm=batch_norm)
    wanted = [
        {"batch_size": micro, "accumulation_steps": steps, **form}
        for micro, steps in splits.items()
        for form in formats_for(space, "fp32")
    ]
    if batch_norm:
        assert {(s["batch_size"], s["accumulation_steps"]) for s in wanted} == {(32, 2)}
    else:
        assert {(s["batch_size"], s["accumulation_steps"]) for s in wanted} == {
            (16, 4),
            (32, 2),
            (64, 1),
        }
    reference = first_losses(task_name, baseline, steps=6)
    loaders = [
        {"num_workers": 0},
        {"num_workers": 2, "prefetch_factor": 2},
        {"num_workers": 1, "prefetch_factor": 4},
    ]
    for settings in wanted + loaders:
        losses = first_losses(task_name, {**baseline, **settings}, steps=6)
        assert losses == pytest.approx(reference, rel=1e-4, abs=1e-5), settings
    assert first_losses(task_name, {**baseline, "lr": 0.2}, steps=6) != pytest.approx(
        reference, rel=1e-4, abs=1e-5
    )


def goodput_study(tmp_path: Path, objective_name: str, **extra: object) -> Path:
    path = write_study(tmp_path, trials=3, confirm={"top": 2, "runs": 1})
    study = yaml.safe_load(path.read_text())
    study.update(objective=objective_name, **extra)
    study["space"]["accumulation_steps"] = [1, 2, 4]
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_a_goodput_study_is_timed_by_the_probe_s_table_and_names_each_trial_by_its_fastest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = goodput_study(tmp_path, "goodput", replicates=2)
    raw = yaml.safe_load(path.read_text())
    raw["space"]["num_workers"] = [0, 2]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    study = load(path)
    outcome, stored = schema.probe(study.user_attrs), schema.throughput(study.user_attrs)
    assert outcome["kind"] == "joint" and outcome["chosen"]["measured"]
    assert stored["from_probe"] and stored["table"]["entries"] == table_entries(outcome)
    table = goodput.Table.from_json(stored["table"])
    # the chosen setting at every micro-batch of the space
    assert {e.settings["batch_size"] for e in table.entries} == {16, 32, 64} and all(
        e.speed for e in table.entries
    )
    seeds = {t.user_attrs[schema.SEED] for t in study.trials}
    assert len(seeds) == 1  # paired: every trial's runs share their seeds
    timed = [t for t in study.trials if schema.prediction(t) is not None]
    assert timed, "some trial reached the target"
    for trial in timed:
        predicted, config = schema.prediction(trial), schema.trained_config(trial)
        assert {k: config[k] for k in LOADER_KNOBS} == outcome["loader"]
        speed = goodput.Speed(predicted["samples_per_second"], predicted["fixed_seconds"])
        assert trial.value == pytest.approx(speed.seconds(predicted["samples_to_target"]))
        assert goodput.same_maths(config, predicted["trained"], batch_norm=False)
        best, _ = table.fastest(config, goodput_space(path), samples=predicted["samples_to_target"])
        assert best == {**config, **{k: best[k] for k in config if k not in best}}
    confirmation = schema.confirmation(study.user_attrs)
    assert (
        set(confirmation["predicted"]) <= {f"trial {t.number}" for t in timed}
        and confirmation["predicted"]
    )
    # the confirmation sets the prediction beside the measurement
    assert "; predicted " in out and "Trials timed from the probe's table: " in out
    # Run again with a larger budget: the stored table is used, not measured again.
    code, _, err = run_cli("run", str(path), "--trials", "4", capsys=capsys)
    assert code == 0, err
    assert schema.throughput(load(path).user_attrs) == stored


def goodput_space(path: Path) -> Space:
    from autotune.spec import study_file

    return study_file.load(path).space


def test_a_systems_only_study_trains_the_baselines_maths_once_and_tells_every_other_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = goodput_study(
        tmp_path, "systems_only", baseline={"lr": 0.1, "batch_size": 32, "accumulation_steps": 2}
    )
    raw = yaml.safe_load(path.read_text())
    raw["space"].update(num_workers=[0, 2], precision=["fp32", "bf16"])
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    study = load(path)
    outcome, stored = schema.probe(study.user_attrs), schema.throughput(study.user_attrs)
    # the probe chose at the baseline's precision, at a micro-batch that splits its batch of 64
    assert {r["precision"] for r in outcome["compute_rates"]} == {"fp32"}
    assert outcome["batch_size"] in (16, 32, 64) and outcome["precisions"] == ["fp32"]
    assert stored["from_probe"]
    table = goodput.Table.from_json(stored["table"])
    assert sorted(e.settings["batch_size"] for e in table.entries) == [16, 32, 64]
    trained = [t for t in study.trials if "from_trial" not in (schema.prediction(t) or {})]
    told = [t for t in study.trials if "from_trial" in (schema.prediction(t) or {})]
    assert len(trained) == 1
    samples = schema.prediction(trained[0])["samples_to_target"]
    splits = {
        (schema.trained_config(t)["batch_size"], schema.trained_config(t)["accumulation_steps"])
        for t in [*trained, *told]
    }
    # every split of the baseline's 64 the space allows
    assert splits == {(16, 4), (32, 2), (64, 1)}
    for trial in [*trained, *told]:
        config = schema.trained_config(trial)
        assert (config["lr"], config["precision"]) == (0.1, "fp32")
        assert config["batch_size"] * config["accumulation_steps"] == 64
        assert schema.prediction(trial)["samples_to_target"] == samples
    for trial in told:
        assert {k: schema.trained_config(trial)[k] for k in LOADER_KNOBS} == outcome["loader"]
    code, _, _ = run_cli("run", str(path), capsys=capsys)  # resumed: nothing new to tell
    assert code == 0 and len(load(path).trials) == len(study.trials)


def test_a_systems_only_try_that_misses_the_target_trains_again_on_new_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The task's model is blind under trial 0's seeds, so the baseline's maths misses there.
    path = goodput_study(
        tmp_path,
        "systems_only",
        task="tests.tasks:misses_on_trial_zero",
        replicates=2,
        baseline={"lr": 0.1, "batch_size": 32, "accumulation_steps": 2},
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    study = load(path)
    trained = [t for t in study.trials if "from_trial" not in (schema.prediction(t) or {})]
    assert [(t.number, derived.is_feasible(t)) for t in trained] == [(0, False), (1, True)]
    # the second try's seeds are its own
    assert [t.user_attrs[schema.SEED] for t in trained] == [
        0,
        1,
    ]
    assert schema.trained_config(trained[1])["lr"] == 0.1
    told = [t for t in study.trials if "from_trial" in (schema.prediction(t) or {})]
    assert told and all(schema.prediction(t)["from_trial"] == 1 for t in told)
    # none without a feasible trial: one try's luck left none
    confirmed = schema.confirmation(study.user_attrs)
    assert confirmed is not None and set(confirmed["trials"]) <= {
        t.number for t in [trained[1], *told]
    }
    code, _, _ = run_cli("run", str(path), capsys=capsys)  # resumed: nothing trains again
    assert code == 0 and len(load(path).trials) == len(study.trials)


def test_systems_only_trains_at_most_three_tries(tmp_path: Path) -> None:
    from autotune.spec import study_file
    from autotune.study import budget

    spec = study_file.load(goodput_study(tmp_path, "systems_only"))

    def tried(*feasible: bool) -> list[optuna.trial.FrozenTrial]:
        return [
            optuna.trial.create_trial(value=1.0, constraints={"target": -1.0 if ok else 0.2})
            for ok in feasible
        ]

    assert [
        budget.trials_to_train(spec, tried(*outcomes))
        for outcomes in [
            (),
            (True,),
            (False,),
            (False, True),
            (False, False),
            (False, False, False),
        ]
    ] == [1, 1, 2, 2, 3, 3]
    other = study_file.load(
        goodput_study(tmp_path, "goodput", budget={"trials": 5, "max_epochs": 4})
    )
    assert budget.trials_to_train(other, tried(False, False)) == 5  # other objectives: the budget's


def test_goodput_needs_a_task_autotune_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "command.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task": {"command": "python train.py"},
                "target": {"metric": "accuracy", "value": 0.9},
                "objective": "goodput",
            }
        )
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 2 and "objective" in err and "goodput" in err and "Traceback" not in err


def test_under_goodput_the_first_trial_is_the_baselines_maths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = goodput_study(
        tmp_path, "goodput", first_trial="baseline", baseline={"lr": 0.1, "batch_size": 16}
    )
    code, _, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    first = load(path).trials[0]
    assert schema.is_baseline(first)
    trained = (schema.prediction(first) or {}).get("trained") or schema.trained_config(first)
    assert (trained["lr"], trained["batch_size"] * trained["accumulation_steps"]) == (0.1, 16)
