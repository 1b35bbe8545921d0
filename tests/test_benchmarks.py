"""The search benchmarks' bookkeeping (benchmarks/search.py, found.py's oracle), on a made-up grid:
what it charges a pruned trial, how it judges a configuration, when a search counts as near the
optimum, which configuration is the oracle. And every CPU benchmark run whole, at its smallest."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.grid import GRID, key, true_time
from benchmarks.search_replay import STRATEGIES, STUDIES, replay, replay_study
from benchmarks.search_tables import first_within

REPO = Path(__file__).resolve().parent.parent


def made_up_grid() -> dict[str, list[dict]]:
    """Every configuration takes 4 s (2 s when lr is 0.3) to reach the target; bf16 misses it."""
    grid = {}
    for values in itertools.product(*GRID.values()):
        config = dict(zip(GRID, values))
        seconds = 2.0 if config["lr"] == 0.3 else 4.0
        reached = config["precision"] == "fp32"
        curve = [[seconds / 2, 1.0, 0.5], [seconds, 2.0, 0.99 if reached else 0.6]]
        grid[key(config)] = [
            {
                "config": config,
                "reached": reached,
                "time_to_target": seconds if reached else None,
                "train_seconds": seconds,
                "curve": curve,
            }
        ]
    return grid


def run(name: str, **kwargs) -> dict:
    return replay(made_up_grid(), strategy=STRATEGIES[name], seed=0, trials=30, **kwargs)


def test_a_configuration_is_judged_by_its_median_run_and_a_miss_is_infinitely_slow() -> None:
    runs = [{"reached": True, "time_to_target": t} for t in (1.0, 3.0)] + [
        {"reached": False, "time_to_target": None}
    ]
    assert true_time(runs) == 3.0
    assert true_time(runs[1:]) == math.inf  # one of two runs missed: the median is a miss


def test_a_trial_past_the_incumbent_is_charged_the_incumbents_time() -> None:
    plain, pruned = run("autotune-sampler"), run("autotune+incumbent")
    assert plain["best"] == pruned["best"] == 2.0
    assert pruned["compute"] < plain["compute"]
    # after the first 2 s configuration, no trial costs more than 2 s
    first = pruned["improvements"][-1]
    assert first[2] == 2.0 and pruned["compute"] <= first[1] + 2.0 * (30 - first[0])


def test_the_probe_is_charged_and_narrows_the_space() -> None:
    probed = {"seconds": 5.0, "loader": {"num_workers": 0}, "precisions": ["fp32"]}
    result = run("autotune+incumbent+probe", probed=probed)
    assert result["compute"] >= 5.0 and result["improvements"][0][1] >= 5.0 + 2.0
    assert result["best"] == 2.0


def test_near_the_optimum_is_when_the_reported_configuration_first_gets_within_the_limit() -> None:
    improvements = [(1, 4.0, 4.0), (5, 12.0, 2.5), (9, 20.0, 2.0)]
    assert first_within(improvements, 2.2) == (9, 20.0)
    assert first_within(improvements, 2.75) == (5, 12.0)
    assert first_within(improvements, 1.0) is None


@pytest.mark.parametrize("name", ["random", "tpe-default", "autotune+incumbent+median"])
def test_every_strategy_spends_its_budget_and_finds_the_fast_configurations(name: str) -> None:
    result = run(name)
    assert result["best"] == 2.0 and result["compute"] >= 2.0


BASELINE = {
    "lr": 0.01,
    "scheduler": "constant",
    "batch_size": 32,
    "accumulation_steps": 1,
    "num_workers": 0,
    "precision": "fp32",
}
PROBED = {"seconds": 1.0, "loader": {"num_workers": 0}, "precisions": ["fp32", "bf16"]}


def lucky_grid() -> dict[str, list[dict]]:
    """The baseline takes 4 s on each of 3 seeds; every other configuration takes 0.5 s on one seed
    and 9 s on the others: a single run finds a lucky winner, a median does not."""
    grid = {}
    for values in itertools.product(*GRID.values()):
        config = dict(zip(GRID, values))
        times = [4.0] * 3 if config == BASELINE else [0.5, 9.0, 9.0]
        grid[key(config)] = [
            {
                "config": config,
                "reached": True,
                "time_to_target": t,
                "train_seconds": t,
                "curve": [[t, 1.0, 0.99]],
            }
            for t in times
        ]
    return grid


def study(name: str, grid: dict | None = None, seed: int = 0, probed: dict = PROBED) -> dict:
    return replay_study(
        grid or lucky_grid(),
        strategy=STUDIES[name],
        seed=seed,
        trials=20,
        baseline=BASELINE,
        probed=probed,
    )


def test_a_replayed_study_reports_the_fast_configuration_and_pays_for_its_confirmation() -> None:
    grid = made_up_grid()
    shipped, unconfirmed = (
        study("autotune as shipped (replicates 3)", grid),
        study("as shipped, no confirmation", grid),
    )
    for found in (shipped, unconfirmed, study("plain TPE", grid)):
        winner = json.loads(found["winner"])
        assert winner["lr"] == 0.3 and winner["precision"] == "fp32" and not found["kept_baseline"]
    # the confirmation: the baseline's run (4 s) and the best trials' (2 s each) on top of the same
    # search
    assert shipped["compute"] >= unconfirmed["compute"] + 4.0 + 2.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_lucky_run_wins_a_plain_search_but_not_a_confirmed_study(seed: int) -> None:
    plain = study("plain TPE", seed=seed)
    # a 0.5 s run won: its configuration's median is 9 s
    assert json.loads(plain["winner"]) != BASELINE
    for name in ("autotune, one run per trial", "autotune as shipped (replicates 3)"):
        found = study(name, seed=seed)
        assert found["kept_baseline"] and json.loads(found["winner"]) == BASELINE, name


def test_first_trial_baseline_starts_the_replay_at_the_baseline_where_the_probe_left_it() -> None:
    assert json.loads(study("as shipped + first_trial: baseline")["first"]) == BASELINE
    assert json.loads(study("autotune as shipped (replicates 3)")["first"]) != BASELINE
    # the baseline's loader is outside the probed space
    elsewhere = {
        **PROBED,
        "loader": {"num_workers": 1},
    }
    assert (
        json.loads(study("as shipped + first_trial: baseline", probed=elsewhere)["first"])
        != BASELINE
    )


def test_the_oracle_is_the_lowest_median_and_under_systems_only_keeps_the_baselines_maths(
    tmp_path,
) -> None:
    from benchmarks.found_study import oracle

    grid = made_up_grid()
    path = tmp_path / "grid.jsonl"
    rows = [{**run, "seed": 1} for runs in grid.values() for run in runs]
    # one more seed: a configuration whose single lucky run would win on its fastest run loses on
    # its median
    lucky = dict(
        rows[0]["config"],
        lr=0.01,
        scheduler="cosine",
        batch_size=16,
        accumulation_steps=1,
        num_workers=0,
        precision="fp32",
    )
    for row in rows:
        if row["config"] == lucky:
            row.update(time_to_target=0.5)
    rows += [
        {**row, "seed": 2, "time_to_target": 9.0} if row["config"] == lucky else {**row, "seed": 2}
        for row in rows
    ]
    rows += [{**row, "seed": 3} for row in rows if row["seed"] == 2]
    path.write_text("{}\n" + "\n".join(json.dumps(r) for r in rows))
    best, median = oracle(path, {}, same_maths=False)
    assert median == 2.0 and best["lr"] == 0.3 and best["precision"] == "fp32"
    baseline = {
        "lr": 0.01,
        "scheduler": "constant",
        "batch_size": 32,
        "accumulation_steps": 1,
        "precision": "fp32",
    }
    best, median = oracle(path, baseline, same_maths=True)
    assert median == 4.0 and {k: best[k] for k in baseline} == baseline


def test_the_regret_table_sets_each_strategy_beside_plain_tpe_in_the_same_machine_state(
    tmp_path, monkeypatch
) -> None:
    from benchmarks import regret
    from benchmarks.found_report import results_name

    def write(name: str, compute: float, regrets: list[float]) -> None:
        studies = [{"baseline_median": 2.0, "oracle_median": 1.0, "regret": x} for x in regrets]
        summary = {
            "median_regret": sorted(regrets)[len(regrets) // 2],
            "within_10": sum(x <= 1.1 for x in regrets),
            "not_worse": len(regrets),
            "median_speedup": 1.5,
            "median_compute": compute,
            "median_prediction_error": None,
        }
        (tmp_path / name).write_text(json.dumps({"summary": summary, "studies": studies}))

    def name(strategy: str, load: bool, regret: bool = True, study: str = "digits") -> str:
        # the names found.py writes
        return results_name(
            study,
            strategy,
            replicates=3 if strategy == "goodput" else None,
            load=load,
            regret=regret,
            device="cpu",
        )

    write(name("plain_tpe", False), 100.0, [1.3, 1.4, 1.5])
    write(name("goodput", False), 40.0, [1.0, 1.05, 1.2])
    write(name("plain_tpe", True), 50.0, [2.0])
    write(name("goodput", True), 100.0, [1.0])
    write(name("goodput", False, regret=False), 1.0, [1.0])  # not a regret run: left out
    write(name("goodput", False, study="digits-large"), 1.0, [1.0])  # another study file: left out
    monkeypatch.setattr(regret, "RESULTS", tmp_path)
    found = regret.rows("digits", "cpu")
    assert [(r["strategy"], r["loaded"]) for r in found] == [
        ("goodput", False),
        ("plain_tpe", False),
        ("goodput", True),
        ("plain_tpe", True),
    ]
    lines = regret.table(found).splitlines()[2:]
    # oracle 2x the baseline
    assert "| 2 of 3 |" in lines[0] and "| 0.40 |" in lines[0] and "| 2.00x |" in lines[0]
    assert "| 2.00 |" in lines[2]  # loaded goodput against loaded plain TPE, not the quiet one


def test_the_oracle_is_remeasured_under_each_value_of_a_searched_knob_the_grid_leaves_out() -> None:
    from autotune.search.space import Choices, Range, Space
    from benchmarks.found_study import oracle_variants

    space = Space(
        domains=(
            ("lr", Range(0.001, 0.3, log=True)),
            ("channels_last", Choices((False, True))),
            ("compile", Choices((False,))),
        )
    )
    assert oracle_variants({"lr": 0.3}, space) == {
        "oracle channels_last=False": {"lr": 0.3, "channels_last": False},
        "oracle channels_last=True": {"lr": 0.3, "channels_last": True},
    }
    assert oracle_variants({"lr": 0.3, "channels_last": True}, space) == {
        "oracle": {"lr": 0.3, "channels_last": True}
    }


def test_prediction_error_sets_each_trials_runs_against_its_prediction_skips_told_ones() -> None:
    import optuna

    from autotune.record import schema
    from benchmarks.arms import trial_prediction_error

    study = optuna.create_study()

    def add(result: dict) -> None:
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={schema.RESULT: result}))

    # mean 1.1: +10%
    add(
        {
            "time_to_target": 1.2,
            "replicates": [{"time_to_target": 1.2}, {"time_to_target": 1.0}],
            schema.PREDICTION: {"seconds": 1.0, "trained": {"batch_size": 32}},
        }
    )
    # +50%
    add({"time_to_target": 3.0, schema.PREDICTION: {"seconds": 2.0, "trained": {"batch_size": 64}}})
    # told, not trained
    add({"time_to_target": 0.0, schema.PREDICTION: {"seconds": 9.0, "from_trial": 0}})
    add({"time_to_target": 5.0})  # not a goodput trial
    assert trial_prediction_error(study) == pytest.approx(0.3)


def test_a_study_that_found_nothing_leaves_the_user_with_the_baseline() -> None:
    from benchmarks.arms import NONE_FOUND
    from benchmarks.found_report import summarize_rows

    def row(winner: str, won: float, not_worse: bool) -> dict:
        return {
            "winner": winner,
            "speedup": 2.0 / won,
            "beats_baseline": won < 2.0 and winner.startswith("trial"),
            "not_worse": not_worse,
            "tuning_wall": 1.0,
            "trial_compute": 1.0,
            "regret": won,
            "baseline_median": 2.0,
        }

    # the same configuration as the baseline, re-measured 10% slower: noise, and still the user's
    # own
    rows = [
        row("trial 3", 1.5, True),
        row("trial 4", 2.5, False),
        row(NONE_FOUND, 2.2, False),
        row("baseline", 2.1, True),
    ]
    summary = summarize_rows(rows)
    assert (
        summary["kept_baseline"] == 2
        and summary["not_worse"] == 3
        and summary["beats_baseline"] == 1
    )


def run_benchmark(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run benchmarks/`script` whole, as a user does from the repository root (with `env` added
    to the environment); what it printed."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


# digits to a target its first evaluation reaches, its runs cut at a second: device_data's arms
# each train a few steps
SMALLEST_DIGITS = """
task: digits
target: {metric: accuracy, value: 0.3}
space: {preset: default, num_workers: [0]}
budget: {trials: 1, max_epochs: 1, max_seconds: 1, eval_every: 0.25}
device: cpu
"""


@pytest.mark.parametrize(
    ("script", "args", "written", "holds"),
    [
        (
            "overhead.py",
            # one warm-up round and one measured, of studies of 1 and 2 trials
            ["--trials", "1", "2", "--rounds", "1", "--epochs", "0.05"],
            "overhead-cpu.json",
            "commit",
        ),
        (
            "isolation_overhead.py",
            # the overhead benchmark's trivial task: the children's start, not digits' training
            ["--runs", "1", "--epochs", "0.05", "--device", "cpu"]
            + ["--task", "benchmarks.trivial:task"],
            "isolation_overhead-cpu-0.05ep.json",
            "commit",
        ),
        (
            "schedule_length.py",
            ["--seeds", "1", "--max-seconds", "0.3"],
            "schedule_length-digits-cpu.json",
            "summary",
        ),
        (
            "device_data.py",
            ["--seeds", "1", "--study", "{tmp_path}/smallest.yaml"],
            "device-data-smallest-cpu.json",
            "speed_ratio_against",
        ),
    ],
)
def test_each_cpu_benchmark_runs_at_its_smallest(
    tmp_path: Path, script: str, args: list[str], written: str, holds: str
) -> None:
    """A benchmark no test runs can stop running unseen (one did): each runs here, small, and
    writes its figures where --results says, not over the recorded ones."""
    (tmp_path / "smallest.yaml").write_text(SMALLEST_DIGITS)
    args = [arg.format(tmp_path=tmp_path) for arg in args]
    run_benchmark(script, *args, "--results", str(tmp_path / "results"))
    assert holds in json.loads((tmp_path / "results" / written).read_text())


def test_the_device_data_benchmark_sets_each_arm_beside_the_workers_loader_seed_by_seed() -> None:
    from benchmarks.device_data import summarized

    def run(samples: int, seconds: float, reached: bool = True) -> dict:
        return {
            "samples": samples,
            "seconds": seconds,
            "reached": reached,
            "time_to_target": seconds,
        }

    theirs = [run(1000, 1.0), run(1200, 2.0)]
    ours = summarized([run(1500, 0.5), run(900, 1.0, reached=False)], theirs)
    assert ours["samples_per_second"] == {"median": 1950.0, "range": [900.0, 3000.0]}
    assert ours["speed_ratio"] == {"median": 2.25, "range": [1.5, 3.0]}  # 3000/1000, 900/600
    assert ours["time_to_target"]["median"] == 0.5 and ours["reached"] == "1/2"
    # no run reached it: no time (and no NaN, which JSON does not hold)
    missed = summarized([run(1000, 1.0, reached=False)], theirs[:1])
    assert missed["time_to_target"] is None and missed["reached"] == "0/1"


def test_the_grid_benchmark_measures_its_first_configurations_where_results_says(
    tmp_path: Path,
) -> None:
    from benchmarks.grid import SEED, load_grid

    printed = run_benchmark(
        "grid.py", "--configs", "1", "--max-seconds", "0.5", "--results", str(tmp_path)
    )
    header, grid = load_grid(tmp_path / "grid-digits-cpu.jsonl")
    assert header["benchmark"] == "grid" and header["grid"] == GRID and header["seed"] == [SEED]
    assert header["limits"]["max_seconds"] == 0.5 and "commit" in header
    assert len(grid) == 1 and "1/1 " in printed
    for runs in grid.values():
        (row,) = runs
        assert row["seed"] == SEED and row["train_seconds"] > 0 and row["curve"]
        assert row["reached"] == (row["time_to_target"] is not None)
    # the same file goes on under the same limits; under others it is refused, untouched
    before = (tmp_path / "grid-digits-cpu.jsonl").read_bytes()
    refused = subprocess.run(
        [sys.executable, "benchmarks/grid.py", "--configs", "1", "--results", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0 and "holds runs under other limits" in refused.stderr
    assert (tmp_path / "grid-digits-cpu.jsonl").read_bytes() == before


def test_the_recorded_grid_s_limits_are_the_digits_study_s() -> None:
    """grid.py with its defaults goes on with the recorded ground truth, not refuse it."""
    import torch

    from autotune.spec import study_file
    from autotune.study.preparation import limits_for
    from benchmarks.grid import start

    recorded = REPO / "benchmarks" / "results" / "grid-digits-cpu.jsonl"
    limits = limits_for(study_file.load(REPO / "studies" / "digits.yaml"))
    done = start(recorded, seeds=[1], limits=limits, device=torch.device("cpu"))
    assert len(done) > 100


# A study small enough to run whole in seconds: digits, to a target its baseline reaches in about
# an epoch, 2 short trials, no probe (neither benchmark's test is about it); each re-measurement
# trains its whole schedule, 2 epochs
TINY_STUDY = """
task: digits
target: {metric: accuracy, value: 0.8}
objective: time_to_target
replicates: 1
space: {preset: default, num_workers: [0]}
probe: none
budget: {trials: 2, max_epochs: 2, max_seconds: 3, eval_every: 0.5}
confirm: {top: 1, runs: 1}
seed: 0
device: cpu
"""
RECORDED_GRID = REPO / "benchmarks" / "results" / "grid-digits-cpu.jsonl"


def test_the_found_benchmark_runs_a_study_remeasures_it_and_resumes(tmp_path: Path) -> None:
    """One study, its winner re-measured beside the baseline and the recorded grid's oracle (under
    each value of the knobs the grid leaves out); run again, it keeps the study it has."""
    study = tmp_path / "tiny.yaml"
    study.write_text(TINY_STUDY)
    args = ["--studies", "1", "--seeds", "1", "--oracle", str(RECORDED_GRID)]
    args += ["--results", str(tmp_path / "results"), str(study)]
    printed = run_benchmark("found.py", *args)
    out = tmp_path / "results" / "found-tiny-time_to_target-regret-cpu.json"
    record = json.loads(out.read_text())
    assert record["benchmark"] == "found" and record["args"]["oracle"] == str(RECORDED_GRID)
    assert record["summary"]["studies"] == 1 and "median_regret" in record["summary"]
    (row,) = record["studies"]
    assert row["seed"] == 1 and row["fresh_seeds"] == 1
    assert {"winner", "speedup", "regret", "oracle_median", "fixed_speedup"} <= set(row)
    oracles = [label for label in row["stats"] if label.startswith("oracle")]
    assert oracles and set(row["oracle_variants"]) == set(oracles)
    assert all(stats["runs"] == 1 for stats in row["stats"].values())
    assert "tiny study seed 1:" in printed and f"written: {out}" in printed

    again = run_benchmark("found.py", *args)
    assert "study seed" not in again and f"written: {out}" in again
    assert json.loads(out.read_text())["studies"] == record["studies"]


def test_the_search_benchmark_replays_every_strategy_on_the_recorded_grid(
    tmp_path: Path,
) -> None:
    """Every strategy and whole study replayed; the systems probe the replay charges is
    autotune's own, run for real on digits over the grid's loader settings and precisions, with
    the task's baseline beside it."""
    printed = run_benchmark(
        "search.py",
        *("--seeds", "1", "--trials", "4", "--studies", "1", "--study-trials", "4"),
        *("--grid", str(RECORDED_GRID), "--results", str(tmp_path)),
        # the probe's own time cap, not the suite's hour: on a busy machine its windows may never
        # agree, and each measurement would go on for its every round
        env={"AUTOTUNE_PROBE_SECONDS": "60"},
    )
    record = json.loads((tmp_path / "search-digits-cpu.json").read_text())
    assert record["benchmark"] == "search" and record["within"] == [0.1, 0.25]
    assert list(record["summary"]) == list(record["runs"]) == list(STRATEGIES)
    assert all(len(searches) == 1 for searches in record["runs"].values())
    assert list(record["studies"]) == list(STUDIES) and set(record["baseline"]) == set(GRID)
    assert "results" not in record["args"] and "written: " in printed
    # the probe (search.measure_probe) as the replays were charged for it: settled within the
    # grid's settings, or (only where the machine is too busy for it) cut by its cap, saying so
    probed = record["probe"]
    assert probed["seconds"] > 0 and set(probed["precisions"]) <= set(GRID["precision"])
    if probed.get("unsettled"):
        assert "capped" in probed, probed["unsettled"]
    else:
        assert probed["loader"]["num_workers"] in GRID["num_workers"]


def test_the_never_worse_benchmark_runs_a_study_judges_it_and_resumes(tmp_path: Path) -> None:
    """One study, its recommendation judged by the export on a fresh seed beside the baseline,
    the goals against it; run again, nothing runs twice."""
    study = tmp_path / "tiny.yaml"
    # no confirmation: the study's best trial is its recommendation, so that the judge has one to
    # judge (a confirmation may keep the baseline)
    study.write_text(TINY_STUDY.replace("confirm: {top: 1, runs: 1}", "confirm: {top: 0}"))
    args = ["--studies", "1", "--seeds", "1", "--loads", "quiet", "--study", str(study)]
    args += ["--results", str(tmp_path / "results")]
    printed = run_benchmark("never_worse.py", *args)
    record = json.loads((tmp_path / "results" / "never-worse-tiny-cpu.json").read_text())
    found = record["studies"]["head/quiet/1"]
    assert found["load"] == "quiet" and found["study_seconds"] > 0
    assert found["baseline_kept"] or found["judge"]["runs"] == 1
    row = record["goals"]["head/quiet"]
    assert row["studies"] == 1 and row["never_slower"] == (row["slower"] == 0)
    assert "\nhead/quiet/1:" in "\n" + printed
    again = run_benchmark("never_worse.py", *args)
    assert "head/quiet/1:" not in again and "judged" not in again
    kept = json.loads((tmp_path / "results" / "never-worse-tiny-cpu.json").read_text())
    assert kept["studies"]["head/quiet/1"]["study_seconds"] == found["study_seconds"]


def test_the_never_worse_benchmarks_load_keeps_every_core_busy_and_ends_with_its_block() -> None:
    from benchmarks.never_worse import spinning

    with spinning(2):
        deadline = time.monotonic() + 30  # a process started a moment ago may not have exec'd
        spinners: list[Path] = []
        while len(spinners) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            spinners = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _spins(p)]
        assert len(spinners) >= 2
    time.sleep(0.2)
    assert not [p for p in spinners if p.exists() and _spins(p)]


def _spins(process: Path) -> bool:
    try:
        return b"while os.getppid() == parent: pass" in (process / "cmdline").read_bytes()
    except OSError:
        return False
