"""Never worse, quiet or loaded: does a study ever recommend a configuration slower than the
baseline, and what do its probe and the whole study cost, on a quiet machine and a busy one?

The study file (the README's, studies/digits.yaml, by default) is run `--studies` times on a quiet
machine and as many times while the benchmark keeps every core busy (one process spinning per
core, started before the study and stopped after it), each a fresh `autotune run` in a process of
its own with its own study seed. With `--base COMMIT`, the same studies also run with that
commit's autotune (a git worktree of it), interleaved with this checkout's, under the same load.
Each study's recommendation is read from `autotune report --json` as that commit writes it.

The judge is not autotune's training loop: each recommended configuration and the baseline are
trained by the plain-PyTorch module `autotune export --format torch` writes (what a user's own
trainer runs), evaluation off the clock, on `--seeds` fresh seeds, the two interleaved seed by
seed, on a quiet machine. A study whose recommendation is the baseline kept what the user had.

    .venv/bin/python benchmarks/never_worse.py [--studies 10] [--seeds 5] [--base COMMIT]
                                               [--loads quiet,loaded] [--study FILE]
                                               [--results DIR] [studies judge]

Resumable: each study and each judge run is written to the results file as it ends, and the
same command goes on where it stopped (--fresh starts over). Writes
benchmarks/results/never-worse-<study>-<device>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.provenance import REPO, RESULTS, provenance  # noqa: E402

JUDGE_SEED = 9_000_000  # far from every seed a study uses
HEAD = "head"
GOALS = {
    "probe_seconds": {"quiet": 60, "loaded": 120},
    "study_seconds": {"quiet": 180, "loaded": 360},
}
WINNERS_QUIET = (
    0.8  # of the quiet studies, the share whose winner should be other than the baseline
)


def main() -> None:
    args = arguments()
    from autotune.spec import study_file
    from autotune.study import preparation

    spec = study_file.load(args.study)
    device = preparation.resolve_device(spec)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"never-worse-{args.study.stem}-{device.type}.json"
    record = {} if args.fresh or not out.exists() else json.loads(out.read_text())
    record.setdefault("studies", {})
    record.update(benchmark="never_worse", study=str(args.study), provenance=provenance(device))

    def save() -> None:
        out.write_text(json.dumps(record, indent=1) + "\n")

    stages = args.stages or ["studies", "judge"]
    if "studies" in stages:
        run_studies(record, args, save)
    if "judge" in stages:
        judge(record, args, save)
        record["goals"] = goals(record)
        save()
        print(json.dumps(record["goals"], indent=1))
    print(f"written: {out}")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", metavar="STAGE", help="studies, judge (default: both)")
    parser.add_argument("--studies", type=int, default=10, help="studies per load and commit")
    parser.add_argument("--seeds", type=int, default=5, help="the judge's fresh seeds a study")
    parser.add_argument("--base", metavar="COMMIT", help="also run that commit's autotune")
    parser.add_argument("--loads", default="quiet,loaded", help="quiet, loaded, or both")
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "digits.yaml")
    parser.add_argument("--results", type=Path, default=RESULTS, metavar="DIR")
    parser.add_argument("--fresh", action="store_true", help="discard what the results hold")
    args = parser.parse_args()
    unknown = set(args.stages) - {"studies", "judge"}
    if unknown:
        parser.error(f"unknown stage {', '.join(sorted(unknown))}: studies or judge")
    return args


# ---------------------------------------------------------------------------------------------
# The studies


def run_studies(record: dict[str, Any], args: argparse.Namespace, save: Any) -> None:
    """Every study not yet in `record`, interleaved: by index, then load, then commit."""
    arms = {HEAD: REPO}
    with contextlib.ExitStack() as stack:
        if args.base:
            arms[args.base] = stack.enter_context(worktree(args.base))
        for index in range(1, args.studies + 1):
            for load in args.loads.split(","):
                for arm, source in arms.items():
                    key = f"{arm}/{load}/{index}"
                    if key in record["studies"]:
                        continue
                    record["studies"][key] = one_study(args.study, source, index, load)
                    found = record["studies"][key]
                    print(
                        f"{key}: {found['label']} in {found['study_seconds']:.0f} s "
                        f"(probe {found['probe_seconds'] or 0:.0f} s)",
                        flush=True,
                    )
                    save()


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """That commit's checkout, in a temporary folder, for as long as the block runs."""
    folder = Path(tempfile.mkdtemp(prefix="never-worse-base-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(folder), commit],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=REPO)
        shutil.rmtree(folder, ignore_errors=True)


def one_study(study: Path, source: Path, index: int, load: str) -> dict[str, Any]:
    """`autotune run` of the study file with study seed `index`, by the autotune at `source`,
    in a fresh folder (beside `cores` spinning processes where `load` is loaded); what its report
    recommends, and what the study and its probe took."""
    import yaml

    text = yaml.safe_load(study.read_text())
    text["seed"] = index
    env = {**os.environ, "PYTHONPATH": str(source), "TQDM_DISABLE": "1"}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / study.name
        path.write_text(yaml.safe_dump(text))

        def autotune(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "autotune", args[0], str(path), *args[1:]]
            done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=folder)
            if done.returncode != 0:
                raise SystemExit(
                    f"autotune {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}"
                )
            return done

        with spinning((os.cpu_count() or 1) if load == "loaded" else 0):
            started = time.monotonic()
            autotune("run", "--quiet")
            seconds = time.monotonic() - started
        report = autotune("report", "--json")
    summary = json.loads(report.stdout)
    best, probe = summary.get("best") or {}, summary.get("probe") or {}
    decision = (summary.get("confirmation") or {}).get("decision") or {}
    return {
        "label": best.get("label", "none"),
        "baseline_kept": best.get("trial") is None,
        "params": best.get("params"),
        "baseline": summary["baseline"]["params"] if summary.get("baseline") else None,
        "outcome": decision.get("outcome"),
        "study_seconds": seconds,
        "probe_seconds": probe.get("seconds"),
        "probe_other_cores": probe.get("other_cores"),
        "load": load,
    }


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
    """`count` processes keeping a core busy each, for as long as the block runs."""
    # each spins while its parent lives: a benchmark killed leaves no core busy behind it
    # (the parent's pid given, not read at start: a parent gone before then would be init's)
    spin = f"import os\nparent = {os.getpid()}\nwhile os.getppid() == parent: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# ---------------------------------------------------------------------------------------------
# The judge


def judge(record: dict[str, Any], args: argparse.Namespace, save: Any) -> None:
    """Each study's recommendation beside the baseline, trained by the export on fresh seeds,
    interleaved, on a quiet machine; runs already made are kept."""
    from autotune.search.space import complete
    from autotune.spec import study_file
    from autotune.study import preparation
    from benchmarks.roofline_judge import export_template, judge_run

    spec = study_file.load(args.study)
    prepared = preparation.prepare(spec)
    template = export_template(spec, prepared)
    baseline = complete(prepared.baseline)
    for key, found in record["studies"].items():
        runs = found.setdefault("judged", {"recommended": [], "baseline": []})
        if found["baseline_kept"] or found["params"] is None:
            continue  # kept what the user had: nothing to judge
        if (found.get("judge") or {}).get("runs") == args.seeds:
            continue  # judged in full already
        for index in range(len(runs["baseline"]), args.seeds):
            for name, config in (
                ("recommended", complete(found["params"])),
                ("baseline", baseline),
            ):
                if len(runs[name]) > index:
                    continue
                seed = JUDGE_SEED + index
                runs[name].append(judge_run(template, config, prepared, spec, seed))
            save()
        found["judge"] = verdict_of(runs)
        print(f"judged {key}: {found['judge']}", flush=True)
        save()


def median(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["time_to_target"] if r["reached"] else math.inf for r in runs)


def verdict_of(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ours, base = median(runs["recommended"]), median(runs["baseline"])
    return {
        "recommended_median": ours if math.isfinite(ours) else None,
        "baseline_median": base if math.isfinite(base) else None,
        "speedup": base / ours if math.isfinite(ours) and math.isfinite(base) else None,
        "slower": ours > base,
        "runs": len(runs["recommended"]),
    }


def goals(record: dict[str, Any]) -> dict[str, Any]:
    """Per commit and load: studies, those slower than the baseline on the judge's runs, winners
    other than the baseline, the slowest probe and study, each against its goal."""
    table: dict[str, Any] = {}
    for key, found in record["studies"].items():
        arm, load, _ = key.split("/")
        row = table.setdefault(f"{arm}/{load}", {"studies": 0, "slower": 0, "winners": 0})
        row["studies"] += 1
        row["slower"] += bool((found.get("judge") or {}).get("slower"))
        row["winners"] += not found["baseline_kept"]
        for what in ("probe_seconds", "study_seconds"):
            seconds = found[what] or 0.0
            row[f"max_{what}"] = max(row.get(f"max_{what}", 0.0), seconds)
            row[f"{what}_goal"] = GOALS[what][load]
    for name, row in table.items():
        row["never_slower"] = row["slower"] == 0
        row["probe_met"] = row["max_probe_seconds"] <= row["probe_seconds_goal"]
        row["study_met"] = row["max_study_seconds"] <= row["study_seconds_goal"]
        if name.endswith("/quiet"):
            row["winners_met"] = row["winners"] >= WINNERS_QUIET * row["studies"]
    return table


if __name__ == "__main__":
    main()
