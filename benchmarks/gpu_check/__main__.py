"""The GPU check: autotune's CUDA paths run for real, stage by stage (`bash scripts/gpu-check.sh`).

    python -m benchmarks.gpu_check [STAGE ...] [--cpu] [--rounds N] [--objective OBJECTIVE]
                                   [--results DIR]

Stages (each under 8 minutes on one modern GPU, each runnable on its own, all by default):
  tests      the CUDA tests (tests/test_cuda.py), for real
  oom        a study whose larger micro-batches cannot fit: PRUNED as out of memory, the study goes
             on, configurations known to run out are skipped, memory back after every trial
  precision  fp32, fp16 + GradScaler and bf16, with and without channels_last and compile:
             throughput side by side, interleaved
  study      the shapes study's trials, each in a child process (resumable: run it again until
             it says the study is finished)
  confirm    the finished shapes study's winner against the baseline on fresh seeds, side by
             side, with GPU utilisation, input wait and peak memory
  isolation  what a child process per trial costs on the GPU
  distributed  a trial as one rank of a process group (NCCL), as devices_per_trial runs its ranks:
             it trains, and the GPU's memory is back after

`--objective goodput` or `--objective systems_only` runs the study and confirm stages on the same
shapes study with that objective and `probe: joint`, as a study of its own (its own storage and
results files).

Each writes benchmarks/results/gpu-check-STAGE-cuda.json (GPU, driver, torch and commit with the
figures) and prints a Markdown summary. Without a GPU it says so and checks nothing (exit 0);
`--cpu` runs every stage's plumbing on the CPU at a small size instead (as the test suite does),
writing -cpu.json files. Exit status 1 when a stage's check failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from autotune.spec.study_file import GOODPUT, SYSTEMS_ONLY  # noqa: E402
from benchmarks.gpu_check import memory_stages, speed_stages  # noqa: E402
from benchmarks.gpu_check.common import REPO, RESULTS, Setting, gpu_identity, setting, write  # noqa: E402

# The tests that run CUDA paths for real; on CPU they skip, and the suite runs their CPU twins.
CUDA_TESTS = ("tests/test_cuda.py",)


def tests(setting_: Setting) -> tuple[dict[str, Any], list[str], bool]:
    """pytest over the CUDA tests; on a GPU none may be skipped."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "junit.xml"
        ran = subprocess.run(
            [
                setting_.python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *CUDA_TESTS,
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        suites = ElementTree.parse(report).getroot() if report.exists() else None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in [] if suites is None else suites.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ok = ran.returncode == 0 and (counts["skipped"] == 0 or not setting_.cuda)
    lines = [
        f"{passed} passed, {counts['failures'] + counts['errors']} failed, "
        f"{counts['skipped']} skipped ({' '.join(CUDA_TESTS)})"
    ]
    if not ok:
        lines.append("```\n" + ran.stdout[-3000:] + "\n```")
    return (
        {
            **counts,
            "passed": passed,
            "exit_status": ran.returncode,
            "output_tail": ran.stdout[-3000:],
        },
        lines,
        ok,
    )


Stage = Callable[[Setting], "tuple[dict[str, Any], list[str], bool]"]
STAGES: dict[str, Stage] = {
    "tests": tests,
    "oom": memory_stages.oom,
    "precision": speed_stages.precision,
    "study": speed_stages.study,
    "confirm": speed_stages.confirm,
    "isolation": memory_stages.isolation_overhead,
    "distributed": memory_stages.distributed,
}

ROUNDED = ("precision", "isolation")  # the stages that interleave rounds
STUDIES = ("study", "confirm")  # the stages that run the shapes study (--objective)
OBJECTIVES = (GOODPUT, SYSTEMS_ONLY)  # besides the study file's own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "stages",
        nargs="*",
        choices=[[], *STAGES],
        metavar="STAGE",
        help=f"any of {', '.join(STAGES)} (default: all)",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="run each stage's plumbing on the CPU at a small size"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="interleaved rounds of the precision and isolation stages "
        "(default: 3 and 5; fewer is quicker and noisier)",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        help="run the study and confirm stages' shapes study with this objective instead of its "
        "own, as a study of its own (results in gpu-check-STAGE-OBJECTIVE-cuda.json)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where the JSON files go (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    where = setting(cpu=args.cpu, results=args.results)
    if where is None:
        print(
            "# autotune GPU check\n\n"
            "No CUDA GPU found (torch.cuda.is_available() is false): nothing was checked. "
            "Run this on a machine with an NVIDIA GPU, "
            "or with --cpu to exercise the stages' plumbing here."
        )
        return 0
    identity = gpu_identity()
    print(f"# autotune GPU check on {identity.get('gpu', where.device.type)}\n")
    if identity:
        print(
            f"driver {identity['driver']}, CUDA {identity['cuda_runtime']}, "
            f"{identity['gpu_memory_gib']:.0f} GiB\n"
        )
    failed = []
    for name in args.stages or list(STAGES):
        started = time.perf_counter()
        options: dict[str, Any] = {"rounds": args.rounds} if args.rounds and name in ROUNDED else {}
        if args.objective and name in STUDIES:
            options["objective"] = args.objective
        figures, lines, ok = STAGES[name](where, **options)
        figures["stage_seconds"] = time.perf_counter() - started
        path = write(
            where,
            f"{name}-{options['objective']}" if "objective" in options else name,
            {**figures, "ok": ok},
        )
        print(f"## {name}: {'ok' if ok else 'FAILED'} ({figures['stage_seconds']:.0f} s)\n")
        print("\n".join(lines))
        print(f"\n({path.relative_to(REPO) if path.is_relative_to(REPO) else path})\n", flush=True)
        if not ok:
            failed.append(name)
    if failed:
        print(f"Failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
