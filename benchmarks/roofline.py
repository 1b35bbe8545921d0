"""autotune against its peers, at the limit of the knob space: who trains fastest, and at what cost.

Arms, each on the same study file (studies/shapes.yaml on a GPU; studies/paced.yaml with --cpu):

- `prior`: autotune as shipped: `probe: joint` (the loader and compute settings chosen
  together) and `first_trial: prior` (the first trials a larger batch with a scaled lr and a
  schedule that ends);
- `joint`: the same with the first trials sampled (`first_trial: sampled`);
- `tpe`: what a user writes instead: Optuna's TPE over the same knobs in a hand-written loop, the
  same trial budget, one run a trial, the fastest trial wins (arms.plain_tpe_study);
- `expert`: a fixed recipe, no search: bf16, channels-last, cuDNN's search, as many loader workers
  as the space allows up to the cores, pinned, the largest micro-batch up to 512, onecycle, lr 0.2
  (each as the device allows);
- `limit`, for each arm with the joint probe: the knob space's limit for the samples the arm's
  winner needed to reach the target (as the judge measured them): of the probe's predicted
  settings, the one that would train them soonest, its one-off costs (its loader's start-up and
  its step's first steps, each measured apart) then those samples at its predicted rate;
- `warm`, run only when named: `joint` with `isolation: warm` (one trial process kept between
  trials). `joint` against `prior` and `warm` against `joint` each decide a default. A fresh
  joint-probe arm starts from the probe another measured with the same code on the same machine
  (share_probe), its seconds counted in the arm's GPU time.

The judge (roofline_judge.py) is not autotune's training loop: it trains each arm's winner, and
the baseline, with the plain-PyTorch module `autotune export --format torch` writes for it (what
a user's own trainer runs), evaluating off the clock every `budget.eval_every` epochs, on
`--seeds` fresh seeds with the arms interleaved within each seed (the baseline, context for no
goal and the longest to train, on the first seed only). The GPU time each arm spent
searching is its wall time.

Stages write their figures as they go (a stage cut short still tells something). The arms'
studies are Optuna journal files (text) in a folder beside the results file (--work: another);
the judge reads only the results file (each arm's winner and the joint probe's figures), so the
judge may run in another session with nothing carried but that file:

    .venv/bin/python benchmarks/roofline.py [--cpu] [--small] [--seeds 3] [--work DIR]
                                            [--minutes M] [--fresh] [--study FILE]
                                            [joint tpe prior warm judge]

With no stage, prior, tpe, judge and joint, in that order. --small: 3 trials, confirmation on 1
seed, 1 judge seed. --study: another study file (the test suite's is smaller still). Writes
benchmarks/results/roofline-<study>[-small]-<device>.json (--results: another folder).

A GPU lent for minutes at a time takes the full benchmark in sittings: with --minutes M no stage
starts a trial, a confirmation or a judge's run once M minutes have passed since the command
began (what runs then finishes), and the same command later goes on where it stopped. A stage the
results file holds as finished is skipped; an unfinished arm goes on with its study, also one
whose sitting was killed (keep the results folder between sittings: its files are text, to
commit; a killed sitting's seconds are counted to within TICK_SECONDS); the judge keeps the runs
it made of candidates that are unchanged, on the same device. Each arm's GPU time is the sum of
its sittings'. --fresh measures the named stages again from the start.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.record import schema  # noqa: E402
from autotune.spec import study_file  # noqa: E402
from autotune.spec.checks import read_yaml  # noqa: E402
from autotune.spec.storage_url import local_path  # noqa: E402
from autotune.storage import opening  # noqa: E402
from autotune.study import preparation  # noqa: E402
from autotune.study.budget import finished_count, trials_to_train  # noqa: E402
from benchmarks.arms import autotune_study, plain_tpe_study, roofline_trials  # noqa: E402
from benchmarks.provenance import REPO, RESULTS, provenance  # noqa: E402
from benchmarks.roofline_judge import JOINT_ARMS, judge  # noqa: E402

# What each searching arm sets in the study file (tpe: Optuna alone, no autotune settings).
# Each names its first trials, so that an arm means the same whatever the default.
ARMS: dict[str, dict[str, str]] = {
    "joint": {"probe": "joint", "first_trial": "sampled"},
    "tpe": {},
    "prior": {"probe": "joint", "first_trial": "prior"},
    "warm": {"probe": "joint", "first_trial": "sampled", "isolation": "warm"},
}
STAGES = (*ARMS, "judge")
# the goals first (autotune as shipped, its peers, the judge), then the arms that decide defaults
DEFAULT_STAGES = ("prior", "tpe", "judge", "joint")
TICK_SECONDS = 5.0  # what a sitting killed midway can leave uncounted


def study_spec(path: Path, *, arm: str, work: Path, small: bool) -> study_file.StudySpec:
    raw = {**read_yaml(path), **ARMS[arm]}
    if small:
        raw["budget"] = {**raw.get("budget", {}), "trials": 3}
        raw["confirm"] = {"top": 1, "runs": 1}
    name = f"{path.stem}-{arm}"
    return dataclasses.replace(
        study_file.from_mapping(raw, path=path, storage=f"journal:///{work / (name + '.journal')}"),
        name=name,
    )


def main() -> None:
    begun = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "stages",
        nargs="*",
        metavar="STAGE",
        help=f"of {', '.join(STAGES)} (default: all, in that order)",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="the paced study on the CPU (the CPU twin)"
    )
    parser.add_argument(
        "--small", action="store_true", help="3 trials, 1 confirmation and judge seed"
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--work",
        type=Path,
        help="the arms' studies (default: beside the results file, its name + -studies)",
    )
    parser.add_argument(
        "--study",
        type=Path,
        help="the study file (default: studies/shapes.yaml, or paced.yaml with --cpu)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--minutes",
        type=float,
        help="start nothing new after this many minutes; the same command goes on later",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="measure the named stages again from the start"
    )
    args = parser.parse_args()
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; the stages are {', '.join(STAGES)}")
    args.stages = args.stages or list(DEFAULT_STAGES)
    study = args.study or REPO / "studies" / ("paced.yaml" if args.cpu else "shapes.yaml")
    seeds = 1 if args.small else args.seeds
    small, hardware = "-small" if args.small else "", "cpu" if args.cpu else "cuda"
    out = args.results / f"roofline-{study.stem}{small}-{hardware}.json"
    args.work = args.work or out.with_name(out.stem + "-studies")
    args.work.mkdir(parents=True, exist_ok=True)
    record = json.loads(out.read_text()) if out.exists() else {"arms": {}}
    if args.fresh:
        for stage in args.stages:
            record["arms"].pop(stage, None)
            if stage == "judge":
                for key in ("judge", "limit", "goals"):
                    record.pop(key, None)
    deadline = None if args.minutes is None else begun + 60 * args.minutes

    def save() -> None:  # whole or not at all: a sitting may be killed at any moment
        partial = out.with_name(out.name + ".partial")
        partial.write_text(json.dumps(record, indent=2, default=str) + "\n")
        os.replace(partial, out)

    def spec_of(stage: str) -> study_file.StudySpec:
        spec = study_spec(study, arm=stage, work=args.work, small=args.small)
        return dataclasses.replace(spec, device="cpu") if args.cpu else spec

    for stage in args.stages:
        if deadline is not None and time.monotonic() >= deadline:
            print(f"{stage}: not begun, the {args.minutes:g} minutes are spent", flush=True)
        elif stage == "judge":
            judge(record, spec_of, seeds=seeds, save=save, deadline=deadline)
        elif stage in record["arms"] and record["arms"][stage].get("finished", True):
            print(f"{stage}: measured already (--fresh measures it again)", flush=True)
        else:
            sit(stage, spec_of(stage), record, save=save, deadline=deadline)


def sit(
    stage: str,
    spec: study_file.StudySpec,
    record: dict[str, Any],
    *,
    save: Callable[[], None],
    deadline: float | None,
) -> None:
    """One sitting of a searching arm: its study begun or gone on with, then its figures."""
    arm = record["arms"].get(stage)
    db = local_path(spec.storage)
    prepared = preparation.prepare(spec)
    record["provenance"] = provenance(prepared.device)
    if arm is None or not db.exists():
        for suffix in ("", ".lock", ".runner.lock"):  # a fresh study
            Path(db.as_posix() + suffix).unlink(missing_ok=True)
        arm = {"sittings": [*share_probe(record, stage, spec)]}
    elsewhere = {s["device"] for s in arm["sittings"]} - {record["provenance"]["device"]}
    if elsewhere:  # its GPU time then adds two devices' seconds: say so, keep each's
        print(f"{stage}: goes on here, its earlier sittings on {', '.join(elsewhere)}")
    # stored before it begins, so that a sitting killed midway (a machine's time limit) leaves
    # its study to go on with and most of its seconds counted
    sitting = {"seconds": 0.0, **record["provenance"]}
    sittings = [*arm["sittings"], sitting]
    record["arms"][stage] = {**arm, "finished": False, "sittings": sittings}
    save()
    with counted(sitting, save):
        found, finished = search(stage, spec, prepared, deadline)
    if spec.probe == "joint" and stage != "tpe":
        study = opening.open_study(spec, create=False)
        found["probe"] = study.user_attrs.get("probe")
        # every trial at a setting the probe measured checks the prediction, not only the winner
        found["trials_vs_predicted"] = roofline_trials(study)
    sitting["seconds"] = found["tuning_wall"]
    record["arms"][stage] = {
        **found,
        "finished": finished,
        "sittings": sittings,
        "gpu_seconds": sum(s["seconds"] for s in sittings),
    }
    save()
    print(
        f"{stage}: {found['winner']} in {found['tuning_wall']:.1f} s"
        + ("" if finished else " (unfinished: the same command goes on)")
        + f": {found['params']}",
        flush=True,
    )


@contextlib.contextmanager
def counted(sitting: dict[str, Any], save: Callable[[], None]) -> Iterator[None]:
    """While the body runs, its seconds so far in `sitting`, saved every TICK_SECONDS."""
    began, done = time.monotonic(), threading.Event()

    def tick() -> None:
        while not done.wait(TICK_SECONDS):
            sitting["seconds"] = time.monotonic() - began
            save()

    ticker = threading.Thread(target=tick, name="sitting-seconds", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def share_probe(
    record: dict[str, Any], stage: str, spec: study_file.StudySpec
) -> list[dict[str, Any]]:
    """A fresh joint-probe arm starts from the probe another joint arm measured with this code on
    this device, and counts its seconds as a sitting of its own: the arms differ only in what
    follows the probe, and each probe costs minutes of GPU. None found: the arm measures its own
    (its sittings start empty). Plain TPE has no probe, whatever the study file says."""
    if stage not in JOINT_ARMS:
        return []
    here = record["provenance"]
    for source in JOINT_ARMS:
        arm = record["arms"].get(source)
        if source == stage or not arm or not arm.get("probe") or not arm.get("sittings"):
            continue
        measured = arm["sittings"][0]  # the probe runs in an arm's first sitting
        if all(measured.get(k) == here[k] for k in ("device", "machine", "code")):
            study = opening.open_study(spec, create=True)
            schema.record_probe(study, arm["probe"])
            return [{"seconds": arm["probe"]["seconds"], "shared_probe": source, **here}]
    return []


def search(
    stage: str, spec: study_file.StudySpec, prepared: preparation.Prepared, deadline: float | None
) -> tuple[dict[str, Any], bool]:
    """One sitting of a searching arm: its trials until `deadline` (time.monotonic()), then, once
    every one has finished and if the deadline has not passed, the confirmation. Its figures and
    whether the arm is finished. `tuning_wall`: this sitting's seconds."""
    if deadline is None:
        timed = spec
    else:
        left = max(0.0, deadline - time.monotonic())
        timed = dataclasses.replace(spec, budget=dataclasses.replace(spec.budget, timeout=left))
    if stage == "tpe":
        kept = opening.make_storage(spec, create=True)
        found = plain_tpe_study(timed, prepared, False, storage=kept)
        return found, found["counts"]["trials"] >= spec.budget.trials
    if deadline is None:
        return autotune_study(spec, prepared, False), True
    # the confirmation waits until every trial has finished, which may be a later sitting
    found = autotune_study(
        dataclasses.replace(timed, confirm=dataclasses.replace(spec.confirm, top=0)),
        prepared,
        False,
    )
    trials = opening.open_study(spec, create=False).get_trials(deepcopy=False)
    if finished_count(trials) < trials_to_train(spec, trials) or time.monotonic() >= deadline:
        return found, False
    confirmed = autotune_study(spec, prepared, False)
    return {**confirmed, "tuning_wall": found["tuning_wall"] + confirmed["tuning_wall"]}, True


if __name__ == "__main__":
    main()
