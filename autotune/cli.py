"""Command line: `autotune run | report | export`. User errors become one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import __version__
from autotune.errors import AutotuneError

if TYPE_CHECKING:  # the heavy imports wait until a command needs them
    import optuna
    import pandas as pd

    from autotune.spec import StudySpec

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, but got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, but got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds greater than 0, but got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds greater than 0, but got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Find the fastest PyTorch training settings that reach your target.")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run (or resume) the study a study file describes")
    run.add_argument("study", help="study file (.yaml)")
    run.add_argument("--trials", type=_positive_int, metavar="N", help="finished trials to reach in total, counting earlier runs")
    run.add_argument("--timeout", type=_positive_float, metavar="S", help="seconds after which no new trial starts")
    run.add_argument("--storage", metavar="URL", help="database URL (default: the study file's, or a SQLite file beside it)")

    report = commands.add_parser("report", help="summarize a study from its storage, without training")
    report.add_argument("study", help="study file (.yaml)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.add_argument("--storage", metavar="URL", help="database URL")

    export = commands.add_parser("export", help="write the winning configuration")
    export.add_argument("study", help="study file (.yaml)")
    export.add_argument("--format", required=True, choices=("yaml", "json"))
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.add_argument("--storage", metavar="URL", help="database URL")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"run": cmd_run, "report": cmd_report, "export": cmd_export}[args.command](args)
    except AutotuneError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        return exc.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from autotune import spec as spec_, study as study_

    spec = spec_.load(args.study, storage=args.storage)
    prepared = study_.prepare(spec)  # every user error surfaces before the storage is touched
    study_.print_notices(prepared.notices)
    try:
        study = study_.run_study(spec, prepared, trials=args.trials, timeout=args.timeout)
        study_.confirm_best(spec, prepared, study)
    except KeyboardInterrupt:
        again = " ".join(["autotune run", args.study, *(f"--storage {args.storage}".split() if args.storage else [])])
        print(f"\nautotune: interrupted; every finished trial is saved in {spec.storage}.\n"
              f"Resume with: {again}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(_report_text(spec, study))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune import report, spec as spec_, study as study_

    spec = spec_.load(args.study, storage=args.storage)
    study = study_.open_study(spec, create=False)
    records, summary = _summary(spec, study)
    print(json.dumps(summary, indent=2) if args.json else report.render(summary, records))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from autotune import export, spec as spec_, study as study_

    spec = spec_.load(args.study, storage=args.storage)
    _, summary = _summary(spec, study_.open_study(spec, create=False))
    if summary["best"] is None:
        raise AutotuneError(f"{spec.path}: no trial has reached the target yet, so there is nothing to export")
    text = export.render(summary, args.format)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise AutotuneError(f"-o {args.output}: cannot write ({exc.strerror})") from None
    else:
        sys.stdout.write(text)
    return 0


def _summary(spec: StudySpec, study: optuna.Study) -> tuple[pd.DataFrame, dict]:
    """Every trial as a table, and the summary made from it and the stored confirmation."""
    from autotune import report, results

    records = results.trial_records(study.get_trials(deepcopy=False))
    target = {"metric": spec.target.metric, "value": spec.target.value}
    return records, report.summarize(spec.name, records, target=target, confirmation=study.user_attrs.get("confirmation"))


def _report_text(spec: StudySpec, study: optuna.Study) -> str:
    from autotune import report

    records, summary = _summary(spec, study)
    return report.render(summary, records)


if __name__ == "__main__":
    sys.exit(main())
