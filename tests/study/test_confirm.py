from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.record import seeds, verdict
from autotune.runners import isolation
from autotune.search.space import DEFAULT_BASELINE
from autotune.study import confirm
from autotune.train.config import Limits
from tests.tasks import cuda_oom

BASE = DEFAULT_BASELINE  # a hand-written script's configuration


def record(label: str, time: float | None) -> dict:
    return {"label": label, "reached": time is not None, "time_to_target": time, "best_metric": 0.9}


def test_median_counts_a_missed_target_as_slowest() -> None:
    stats = verdict.stats([record("a", 1.0), record("a", None), record("a", 3.0)])
    assert stats["a"] == {"median": 3.0, "min": 1.0, "max": 3.0, "runs": 3, "reached": 2}
    assert (
        verdict.stats([record("b", None), record("b", None), record("b", 2.0)])["b"]["median"]
        is None
    )


def test_winner_is_the_lowest_median_and_speedup_is_against_the_baseline() -> None:
    runs = [record("baseline", t) for t in (4.0, 5.0, 6.0, 5.5)]
    runs += [record("trial 1", t) for t in (0.5, 9.0, 9.0, 8.0)]  # one lucky run
    runs += [record("trial 2", t) for t in (2.0, 2.5, 3.0, 2.2)]
    decision = verdict.decide(runs)
    assert decision["winner"] == decision["leader"] == "trial 2"
    assert decision["speedup"] == pytest.approx(5.25 / 2.35)
    stats = verdict.stats(runs)
    assert verdict.speedup(stats, "trial 2") == pytest.approx(5.25 / 2.35)


def test_a_tie_goes_to_the_configuration_that_always_reached_the_target() -> None:
    runs = [record("trial 1", t) for t in (1.0, 2.0, None)] + [
        record("trial 2", t) for t in (2.0, 2.0, 2.5)
    ]
    stats = verdict.stats(runs)
    assert stats["trial 1"]["median"] == stats["trial 2"]["median"] == 2.0
    assert verdict.decide(runs)["leader"] == "trial 2"


def test_the_baseline_wins_when_no_candidate_beats_it_on_fresh_seeds() -> None:
    """A trial that won the study by one lucky run loses the confirmation to the baseline."""
    runs = [record("baseline", t) for t in (2.0, 2.2, 2.4)]
    runs += [record("trial 4", t) for t in (0.9, 3.1, 3.3)]  # its study run was 0.9 s: luck
    decision = verdict.decide(runs)
    assert decision["winner"] == "baseline" and decision["outcome"] == verdict.NOT_FASTER
    missed = verdict.decide([record("baseline", 1.0), record("trial 3", None)])
    assert missed["winner"] == "baseline" and missed["outcome"] == verdict.MISSED
    tie = verdict.decide([record("baseline", 2.0), record("trial 3", 2.0)])
    assert tie["winner"] == "baseline" and tie["outcome"] == verdict.NOT_FASTER


def test_nothing_reaching_the_target_keeps_the_baseline() -> None:
    runs = [record("baseline", None), record("trial 3", None)]
    decision = verdict.decide(runs)
    assert decision["winner"] == "baseline" and decision["outcome"] == verdict.MISSED
    assert verdict.speedup(verdict.stats(runs), "trial 3") is None


def test_measure_interleaves_candidates_on_each_seed_and_survives_oom() -> None:
    base = {**BASE, "lr": 0.05}
    candidates = {"baseline": base, "trial 7": {**base, "batch_size": 256}}
    limits = Limits(target=0.9, max_epochs=5, max_seconds=30, eval_every=0.5)
    records = confirm.run_candidates(
        isolation.in_process(cuda_oom()),
        candidates,
        seeds=[11, 12],
        limits=limits,
        device=torch.device("cpu"),
    )
    assert [(r["label"], r["seed"]) for r in records] == [
        ("trial 7", 11),
        ("baseline", 11),
        ("trial 7", 12),
        ("baseline", 12),
    ]
    assert all(r["reached"] for r in records if r["label"] == "baseline")
    assert all(
        not r["reached"] and "out of memory" in r["reason"]
        for r in records
        if r["label"] == "trial 7"
    )


def test_fresh_seeds_differ_from_every_trial_seed() -> None:
    fresh = seeds.fresh(3, 5)
    assert len(set(fresh)) == 5 and all(s >= 3 * 100_000 + 50_000 for s in fresh)


def test_baseline_is_resolved_once_all_its_runs_are_clearly_slower_than_every_candidates() -> None:
    fast = [record("trial 1", t) for t in (1.0, 1.2)] + [record("trial 2", 1.5)]
    # one run tells nothing while a candidate has run once
    assert not verdict.baseline_resolved(fast + [record("baseline", 9.0)])
    # once each has run twice, one run 2x the slowest of theirs is enough, and 1.25x is not
    twice = fast + [record("trial 2", 1.4)]
    assert verdict.baseline_resolved(twice + [record("baseline", 3.0)])
    assert verdict.baseline_resolved(twice + [record("baseline", None)])  # a miss: slower still
    assert not verdict.baseline_resolved(twice + [record("baseline", 2.9)])
    assert (verdict.resolved_by(1), verdict.resolved_by(2)) == (2.0, 1.25)
    # a miss is slower still
    assert verdict.baseline_resolved(fast + [record("baseline", 9.0), record("baseline", None)])
    # within 1.25x of 1.5
    assert not verdict.baseline_resolved(fast + [record("baseline", 9.0), record("baseline", 1.8)])
    assert verdict.baseline_resolved(fast + [record("baseline", 9.0), record("baseline", 1.9)])
    assert not verdict.baseline_resolved(
        fast + [record("trial 2", None), record("baseline", 9.0), record("baseline", 9.0)]
    )


class Timed:
    """A run_trial whose times to target are given per configuration's lr."""

    def __init__(self, seconds: dict[float, float]) -> None:
        self.seconds, self.calls = seconds, []

    def __call__(self, config, *, limits, device, seed, progress=None):
        self.calls.append((config.lr, seed))
        from autotune.train.config import TrialResult

        t = self.seconds[config.lr]
        return TrialResult(
            reached=True,
            time_to_target=t,
            best_metric=0.95,
            train_seconds=t,
            epochs=1.0,
            optimizer_steps=10,
            samples_per_second=None,
            peak_memory_bytes=None,
            device_name="cpu",
            torch_version=torch.__version__,
            stop_reason="target",
            curve=((t, 1.0, 0.95),),
        )


def test_until_resolved_the_baseline_stops_once_told_apart_and_the_candidates_go_on() -> None:
    base = BASE
    candidates = {"baseline": base, "trial 3": {**base, "lr": 0.1}}
    limits = Limits(target=0.9, max_epochs=5, max_seconds=30, eval_every=0.5)
    slow = Timed({0.01: 10.0, 0.1: 1.0})
    records = confirm.run_candidates(
        slow,
        candidates,
        seeds=[1, 2, 3, 4, 5],
        limits=limits,
        device=torch.device("cpu"),
        until_resolved=True,
    )
    # last on each seed: at its second turn trial 3 has run twice, and 10 s is past 2x its 1 s
    assert [(r["label"], r["seed"]) for r in records] == [
        ("trial 3", 1),
        ("baseline", 1),
        ("trial 3", 2),
        ("trial 3", 3),
        ("trial 3", 4),
        ("trial 3", 5),
    ]
    # 1.5x: past 1.25x, short of 2x: told apart at its third turn, after two runs
    nearer = Timed({0.01: 1.5, 0.1: 1.0})
    records = confirm.run_candidates(
        nearer,
        candidates,
        seeds=[1, 2, 3, 4],
        limits=limits,
        device=torch.device("cpu"),
        until_resolved=True,
    )
    assert [r["label"] for r in records] == ["trial 3", "baseline"] * 2 + ["trial 3"] * 2
    close = Timed({0.01: 1.1, 0.1: 1.0})  # never told apart: the baseline runs on every seed
    records = confirm.run_candidates(
        close,
        candidates,
        seeds=[1, 2, 3],
        limits=limits,
        device=torch.device("cpu"),
        until_resolved=True,
    )
    assert [r["label"] for r in records].count("baseline") == 3
    records = confirm.run_candidates(
        slow, candidates, seeds=[1, 2, 3], limits=limits, device=torch.device("cpu")
    )
    assert [r["label"] for r in records].count("baseline") == 3  # the default: every seed


def test_a_baseline_that_never_reaches_the_target_is_reported_with_why_and_what_to_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its learning rate is too small to reach 0.9 within max_epochs: no speedup can be given, and
    the report says where its runs stopped and which budget key to raise."""
    import yaml

    from tests.study.test_study import run_cli, write_study

    path = write_study(tmp_path, trials=3, confirm={"top": 1, "runs": "auto"})
    study = yaml.safe_load(path.read_text())
    study["baseline"] = {"lr": 1e-5, "batch_size": 64}
    path.write_text(yaml.safe_dump(study))
    code, out, _ = run_cli("run", str(path), capsys=capsys)
    assert code == 0
    assert (
        "the baseline reached it in only 0 of 3 runs: its runs trained all of budget.max_epochs "
        "(4) short of it, so it has no time to compare with; raise budget.max_epochs"
    ) in out, out


def test_precision_effect_pairs_seeds_where_both_reached_and_a_twin_never_wins() -> None:
    runs = [
        {"label": "trial 4", "seed": s, "reached": True, "samples_to_target": n}
        for s, n in ((1, 1100), (2, 1000), (3, 900))
    ]
    runs += [
        {"label": "trial 4 in fp32", "seed": s, "reached": r, "samples_to_target": n}
        for s, r, n in ((1, True, 1000), (2, True, 1000), (3, False, None))
    ]
    effect = verdict.precision_effect(runs, "trial 4", "bf16")
    # seed 3: the twin missed, so that pair says nothing
    assert effect == {
        "trial": "trial 4",
        "precision": "bf16",
        "samples": 1050,
        "fp32_samples": 1000,
        "ratio": 1.05,
        "pairs": 2,
    }
    assert verdict.fp32_twin("trial 4", {"precision": "fp32", "tf32": True}) is None
    assert verdict.fp32_twin("trial 4", {"precision": "bf16", "tf32": False, "lr": 0.1}) == (
        "trial 4 in fp32",
        {"precision": "fp32", "tf32": False, "lr": 0.1},
    )
    timed = [record("baseline", t) for t in (3.0, 3.1, 2.9)]
    timed += [record("trial 4", t) for t in (2.0, 2.1, 1.9)]
    timed += [record("trial 4 in fp32", t) for t in (1.0, 1.1, 0.9)]
    # the twin measures; it is no configuration the study found, nor a chance for one to lead
    decision = verdict.decide(timed)
    assert decision["winner"] == "trial 4" and decision["level"] == pytest.approx(0.05)


def test_confirm_precision_runs_the_fastest_trials_maths_in_fp32_beside_it_and_reports_the_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from tests.study.test_study import load, run_cli, write_study

    path = write_study(tmp_path, trials=3, confirm={"top": 1, "runs": 2, "precision": True})
    study = yaml.safe_load(path.read_text())
    study["space"]["precision"] = "bf16"
    path.write_text(yaml.safe_dump(study))
    code, out, err = run_cli("run", str(path), capsys=capsys)
    assert code == 0, err
    stored = load(path).user_attrs["confirmation"]
    (fastest,) = [
        label for label in stored["configs"] if label.startswith("trial ") and "fp32" not in label
    ]
    assert stored["configs"][fastest + " in fp32"] == {
        **stored["configs"][fastest],
        "precision": "fp32",
        "tf32": False,
    }
    # on the same two seeds
    assert len([r for r in stored["runs"] if r["label"] == fastest + " in fp32"]) == 2
    effect = stored["precision_effect"]
    assert effect is not None and effect["precision"] == "bf16" and effect["pairs"] >= 1
    assert (
        f"Precision, measured: {fastest} in bf16 needed {effect['ratio']:.2f}x the samples" in out
    )
    assert "Winner: " in out and "in fp32 (" not in out.split("Winner: ")[1].splitlines()[0]
