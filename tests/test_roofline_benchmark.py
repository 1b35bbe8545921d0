"""The roofline benchmark's stages (benchmarks/roofline.py) run end to end at the smallest size:
every arm finds a winner, the judge (the exported plain-PyTorch trainer, not autotune's loop)
trains each on a fresh seed, and the limit and the goals are computed from what was measured."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from autotune.storage import opening

REPO = Path(__file__).resolve().parent.parent


def test_every_stage_runs_and_the_judge_measures_every_arm_from_the_results_alone(
    tmp_path: Path,
) -> None:
    study = yaml.safe_load((REPO / "studies" / "paced.yaml").read_text())
    # a lower target than the study file's and a 2-epoch schedule: every trial, confirmation and
    # judge's run trains fewer samples
    study.update(
        task="tests.tasks:paced_quick",
        target={"metric": "accuracy", "value": 0.85},
        budget={"trials": 2, "max_epochs": 2, "max_seconds": 10, "eval_every": 0.25},
    )
    study["space"].update(batch_size=[64, 128], lr=0.1, num_workers=[0, 2])  # fewer to probe
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(study))

    def command(*names: str, work: Path | None = None) -> list[str]:
        return [
            sys.executable,
            "benchmarks/roofline.py",
            "--cpu",
            "--small",
            "--study",
            str(path),
            *(["--work", str(work)] if work else []),
            "--results",
            str(tmp_path),
            *names,
        ]

    def stages(*names: str, work: Path | None = None) -> str:
        result = subprocess.run(
            command(*names, work=work),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    results = tmp_path / "roofline-tiny-small-cpu.json"
    # A first sitting of under a second: the joint probe runs, no trial starts after it, and
    # the stages after it wait.
    said = stages("--minutes", "0.01", "joint", "tpe")
    record = json.loads(results.read_text())
    assert set(record["arms"]) == {"joint"} and not record["arms"]["joint"]["finished"]
    assert "tpe: not begun" in said
    probe = record["arms"]["joint"]["probe"]
    first = record["arms"]["joint"]["gpu_seconds"]
    # A sitting killed midway (a machine's time limit): stored before its study went on, so the
    # next sitting goes on with that study, the same probe.
    killed = subprocess.Popen(
        command("joint"), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while len(json.loads(results.read_text())["arms"]["joint"]["sittings"]) < 2:
        assert killed.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.0)  # into its trials
    killed.kill()
    killed.wait()
    assert not json.loads(results.read_text())["arms"]["joint"]["finished"]
    stages("joint", "tpe", "prior")  # the next sitting goes on
    record = json.loads(results.read_text())
    assert set(record["arms"]) == {"joint", "tpe", "prior"} and "judge" not in record
    joint = record["arms"]["joint"]
    assert joint["finished"] and len(joint["sittings"]) == 3 and joint["counts"]["total"] >= 2
    # its trials at the chosen setting beside what the probe's figures predicted for each: none
    # where no trial reached the target at a probed setting (on a busy machine the incumbent may
    # prune them all); how close the prediction comes depends on the load, so only its shape here
    checked = joint["trials_vs_predicted"]
    if checked is not None:
        assert checked["trials"] >= 1
        assert 0 < checked["range"][0] <= checked["median"] <= checked["range"][1]
    assert joint["probe"] == probe  # measured once, in the first sitting
    assert joint["gpu_seconds"] > first
    # prior starts from joint's probe, its seconds counted as a sitting of prior's own
    prior = record["arms"]["prior"]
    assert prior["probe"] == probe and prior["sittings"][0]["shared_probe"] == "joint"
    assert prior["sittings"][0]["seconds"] == probe["seconds"] == prior["time_spent"]["probe"]
    assert prior["gpu_seconds"] > probe["seconds"] and prior["counts"]["total"] >= 2
    # plain TPE has no probe to share, though the study file asks for one
    assert not any(s.get("shared_probe") for s in record["arms"]["tpe"]["sittings"])
    # the arms' studies are text beside the results file, to keep (commit) between sittings
    studies = tmp_path / "roofline-tiny-small-cpu-studies"
    assert sorted(p.name for p in studies.iterdir()) == [
        f"tiny-{arm}.journal" for arm in ("joint", "prior", "tpe")
    ]
    # the judge in another session: nothing but the results file carried over, no arm's storage
    stages("judge", work=tmp_path / "elsewhere")
    assert not list((tmp_path / "elsewhere").iterdir())
    record = json.loads((tmp_path / "roofline-tiny-small-cpu.json").read_text())
    assert all(arm["gpu_seconds"] > 0 for arm in record["arms"].values())
    assert record["arms"]["joint"]["probe"]["kind"] == "joint"
    assert record["arms"]["joint"]["time_spent"]["probe"] > 0  # where its GPU time went
    runs = record["judge"]["runs"]
    assert set(runs) == {"baseline", "expert", "joint", "tpe", "prior"}
    assert all(len(r) == 1 and r[0]["seconds"] > 0 for r in runs.values())
    assert record["judge"]["candidates"]["expert"]["precision"] == "bf16"
    assert record["judge"]["candidates"]["expert"]["scheduler"] == "onecycle"
    # the limit and the goals for each arm with the joint probe, each against the same peers
    assert set(record["limit"]) == set(record["goals"]) == {"joint", "prior"}
    for arm in ("joint", "prior"):
        limit = record["limit"][arm]
        if runs[arm][0]["reached"]:
            assert limit["fixed_seconds"] > 0  # the limit setting's loader and step started up
            assert limit["seconds"] == pytest.approx(
                limit["fixed_seconds"] + runs[arm][0]["samples"] / limit["predicted"]
            )
        else:
            assert limit is None
        goals = record["goals"][arm]
        assert set(goals) == {
            "vs_best_peer",
            "vs_limit",
            "vs_predicted",
            "found_vs_tpe",
            "gpu_vs_tpe",
            "study_seconds",
        }
        ours, tpe = record["arms"][arm], record["arms"]["tpe"]["gpu_seconds"]
        assert goals["gpu_vs_tpe"] == pytest.approx(ours["gpu_seconds"] / tpe)
        # its winner found before its confirmation, which plain TPE has none of (none where no
        # trial reached the target, as the incumbent may prune them all on a busy machine)
        confirmation = ours["time_spent"]["confirmation"]
        assert confirmation > 0 if ours["winner"] != "none found" else confirmation >= 0
        assert goals["found_vs_tpe"] == pytest.approx((ours["gpu_seconds"] - confirmation) / tpe)
    assert record["provenance"]["commit"] and record["provenance"]["code"]

    # tpe's winner changes (measured again, say): the judge re-makes its runs alone; joint,
    # finished, is not measured again
    before = record["judge"]["runs"]
    record["arms"]["tpe"]["params"]["batch_size"] ^= 64 | 128
    results.write_text(json.dumps(record))
    assert "joint: measured already" in stages("joint", "judge", work=tmp_path / "elsewhere")
    after = json.loads(results.read_text())["judge"]["runs"]
    assert after["tpe"] != before["tpe"] and len(after["tpe"]) == 1
    assert {k: v for k, v in after.items() if k != "tpe"} == {
        k: v for k, v in before.items() if k != "tpe"
    }


def test_the_arms_run_only_when_named_set_what_they_are_to_decide(tmp_path: Path) -> None:
    """prior (as shipped) and warm are the joint arm with one setting changed, so that each,
    judged beside joint, decides its default (first_trial, isolation); each arm names its first
    trials, whatever the default. warm is not among the stages run by default; as shipped is,
    first."""
    sys.path.insert(0, str(REPO))
    from benchmarks import roofline

    assert roofline.DEFAULT_STAGES[0] == "prior" and "warm" not in roofline.DEFAULT_STAGES
    specs = {
        arm: roofline.study_spec(
            REPO / "studies" / "paced.yaml", arm=arm, work=tmp_path, small=True
        )
        for arm in ("joint", "prior", "warm")
    }
    assert {arm: (s.probe, s.first_trial, s.isolation) for arm, s in specs.items()} == {
        "joint": ("joint", "sampled", "auto"),
        "prior": ("joint", "prior", "auto"),
        "warm": ("joint", "sampled", "warm"),
    }
    assert len({s.storage for s in specs.values()}) == 3  # each arm a study of its own


@pytest.mark.parametrize("differs", ["code", "machine", "device"])
def test_a_probe_is_shared_only_from_the_same_code_machine_and_device(
    tmp_path: Path, differs: str
) -> None:
    """A probe measured by other code, or on another machine or device, is not this arm's: it
    measures its own, and no study is made for it."""
    sys.path.insert(0, str(REPO))
    from benchmarks import roofline

    here = {"commit": "abc1234", "code": "9f2c0e", "machine": "node", "device": "NVIDIA H100"}
    probe = {"kind": "joint", "seconds": 61.5}
    record = {
        "provenance": here,
        "arms": {"joint": {"probe": probe, "sittings": [{"seconds": 90.0, **here}]}},
    }
    spec = roofline.study_spec(
        REPO / "studies" / "paced.yaml", arm="prior", work=tmp_path, small=True
    )
    # a commit of results between the sittings changes the commit, not the code
    record["arms"]["joint"]["sittings"][0]["commit"] = "def5678"
    assert roofline.share_probe(record, "prior", spec) == [
        {"seconds": 61.5, "shared_probe": "joint", **here}
    ]
    assert opening.open_study(spec, create=False).user_attrs["probe"] == probe

    other = dataclasses.replace(spec, name="other", storage=f"sqlite:///{tmp_path / 'other.db'}")
    record["arms"]["joint"]["sittings"][0][differs] = "elsewhere"
    assert roofline.share_probe(record, "prior", other) == []
    assert not (tmp_path / "other.db").exists()


def test_the_code_identity_follows_the_code_not_the_results_or_the_docs(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.provenance import code_identity

    for name, text in {
        "autotune/train/step.py": "STEP = 1\n",
        "benchmarks/roofline.py": "ARMS = ()\n",
        "benchmarks/results/roofline-shapes-cuda.json": "{}\n",
        "studies/shapes.yaml": "task: shapes\n",
        "docs/gpu.md": "# figures\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    first = code_identity(tmp_path)
    (tmp_path / "benchmarks/results/roofline-shapes-cuda.json").write_text('{"arms": {}}\n')
    (tmp_path / "docs/gpu.md").write_text("# figures, measured\n")
    assert code_identity(tmp_path) == first
    for changed in ("autotune/train/step.py", "benchmarks/roofline.py", "studies/shapes.yaml"):
        (tmp_path / changed).write_text((tmp_path / changed).read_text() + "# changed\n")
        assert code_identity(tmp_path) != first, changed
        first = code_identity(tmp_path)


def test_a_running_sitting_s_seconds_are_saved_as_it_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a sitting killed midway leaves counted: its seconds up to the last tick."""
    sys.path.insert(0, str(REPO))
    from benchmarks import roofline

    monkeypatch.setattr(roofline, "TICK_SECONDS", 0.05)
    sitting = {"seconds": 0.0}
    saved: list[float] = []
    began = time.monotonic()
    with roofline.counted(sitting, lambda: saved.append(sitting["seconds"])):
        time.sleep(0.5)
    lasted = time.monotonic() - began  # the ticks' clock starts inside, after this one
    assert len(saved) >= 3 and saved == sorted(saved) and 0 < saved[0] < saved[-1] <= lasted
    count = len(saved)
    time.sleep(0.2)
    assert len(saved) == count  # none after the sitting ended


def test_the_judge_runs_the_baseline_on_one_seed_and_goes_on_where_a_sitting_stopped() -> None:
    """Seed by seed, the candidates in turn; the baseline (context, no goal's measure, and the
    longest runs) on its first seed only; the runs an earlier sitting made are not made again."""
    from benchmarks.roofline_judge import BASELINE_SEEDS, to_make

    assert BASELINE_SEEDS == 1
    fresh = to_make({"baseline": 0, "expert": 0, "prior": 0}, seeds=3)
    assert fresh == [
        (0, "baseline"),
        (0, "expert"),
        (0, "prior"),
        (1, "expert"),
        (1, "prior"),
        (2, "expert"),
        (2, "prior"),
    ]
    assert to_make({"baseline": 1, "expert": 2, "prior": 1}, seeds=3) == [
        (1, "prior"),
        (2, "expert"),
        (2, "prior"),
    ]
    # a results file whose baseline ran on every seed keeps those runs and makes no more
    assert to_make({"baseline": 3, "expert": 3}, seeds=3) == []
    assert to_make({"baseline": 0, "expert": 0}, seeds=1) == [(0, "baseline"), (0, "expert")]


def test_the_judge_takes_a_process_s_first_steps_untimed_before_its_first_timed_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A short run of the baseline's maths comes before the first run a sitting times, so that
    what the process's first steps load (on a GPU, 1 s on an H200) lands on no candidate; a
    sitting with no run to make makes none."""
    from autotune.search.space import complete
    from autotune.spec import study_file
    from autotune.study import preparation
    from autotune.train import first_steps
    from benchmarks import roofline_judge

    spec = study_file.load(REPO / "studies" / "paced.yaml")
    prepared = preparation.prepare(spec)
    template = roofline_judge.export_template(spec, prepared)
    baseline = complete(prepared.baseline)
    short = roofline_judge.judge_run(template, baseline, prepared, spec, seed=1, max_steps=3)
    assert short["samples"] == 3 * baseline["batch_size"] and not short["reached"]

    calls = []

    def judged(template, config, prepared, spec, seed, *, max_steps=None):
        calls.append((config == baseline, max_steps))
        return {"reached": True, "time_to_target": 1.0, "samples": 64, "seconds": 1.0}

    monkeypatch.setattr(roofline_judge, "judge_run", judged)
    monkeypatch.setattr(first_steps, "load_much", lambda device: True)  # as a GPU's do
    # the goals want a whole benchmark's figures: beside the point here
    monkeypatch.setattr(roofline_judge, "limit_of", lambda arm, runs: None)
    monkeypatch.setattr(roofline_judge, "goals_of", lambda arm, record, medians: {})
    record = {"arms": {"prior": {"params": baseline, "finished": True}}}
    # a sitting whose time is up as it begins: no run, timed or not
    roofline_judge.judge(
        record, lambda arm: spec, seeds=1, save=lambda: None, deadline=time.monotonic()
    )
    assert calls == []
    roofline_judge.judge(record, lambda arm: spec, seeds=1, save=lambda: None)
    assert calls == [(True, first_steps.FIRST_STEPS), (True, None), (False, None), (True, None)]
    calls.clear()
    roofline_judge.judge(record, lambda arm: spec, seeds=1, save=lambda: None)  # all made
    assert calls == []
    # where they load next to nothing (a CPU's): no untimed run
    monkeypatch.setattr(first_steps, "load_much", lambda device: False)
    fresh = {"arms": {"prior": {"params": baseline, "finished": True}}}
    roofline_judge.judge(fresh, lambda arm: spec, seeds=1, save=lambda: None)
    assert calls == [(True, None), (False, None), (True, None)]


def test_the_judge_trains_a_winner_with_its_data_on_the_device_from_the_task_s_own_copy() -> None:
    """The exported module gathers each batch with the task's device_train, made on the clock."""
    from autotune.search.space import complete
    from autotune.spec import study_file
    from autotune.study import preparation
    from benchmarks import roofline_judge

    spec = study_file.load(REPO / "studies" / "digits.yaml")
    prepared = preparation.prepare(spec)
    gathered, own = [], prepared.task.device_train

    def device_train(device):
        gather = own(device)
        return lambda indices, keys: gathered.append(len(indices)) or gather(indices, keys)

    prepared = dataclasses.replace(
        prepared, task=dataclasses.replace(prepared.task, device_train=device_train)
    )
    template = roofline_judge.export_template(spec, prepared)
    config = {**complete(prepared.baseline), "data_on_device": True}
    run = roofline_judge.judge_run(template, config, prepared, spec, seed=1, max_steps=3)
    assert run["samples"] == 3 * config["batch_size"] and run["seconds"] > 0
    assert gathered[:3] == [config["batch_size"]] * 3
