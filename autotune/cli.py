"""Command line: `autotune run | report | export | dashboard`. User errors become one line and exit 2."""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import __version__
from autotune.errors import AutotuneError, StorageError
from autotune.spec.sections import MAX_SECONDS, MAX_TRIALS
from autotune.spec.study_file import ISOLATION_MODES

if TYPE_CHECKING:  # the heavy imports wait until a command needs them
    import optuna
    import pandas as pd

    from autotune.record.summary import Summary
    from autotune.spec.study_file import StudySpec


def _argument(
    convert: Callable[[str], Any], accepts: Callable[[Any], bool], expected: str
) -> Callable[[str], Any]:
    """An argparse type: `text` converted, and refused with what is accepted unless `accepts` it."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, but got {text!r}")
        return value

    return parse


_positive_int = _argument(int, lambda v: v >= 1, "a whole number of at least 1")
_trials = _argument(int, lambda v: 1 <= v <= MAX_TRIALS, f"a whole number from 1 to {MAX_TRIALS:,}")
_seconds = _argument(
    float,
    lambda v: 0 < v <= MAX_SECONDS,
    f"a number of seconds greater than 0 and at most {MAX_SECONDS:,.0f}",
)
_port = _argument(int, lambda v: 1 <= v <= 65535, "a port number from 1 to 65535")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest PyTorch training settings that reach your target.",
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run (or resume) the study a study file describes")
    run.add_argument("study", help="study file (.yaml)")
    run.add_argument(
        "--trials",
        type=_trials,
        metavar="N",
        help="finished trials to reach in total, counting earlier runs",
    )
    run.add_argument(
        "--timeout", type=_seconds, metavar="S", help="seconds after which no new trial starts"
    )
    run.add_argument(
        "--storage",
        metavar="URL",
        help="database URL (default: the study file's, or a SQLite file beside it)",
    )
    run.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="K",
        help="worker processes on this machine (needs a journal:/// or database-server storage)",
    )
    run.add_argument(
        "--isolation",
        choices=ISOLATION_MODES,
        help="run each trial in a fresh child process (killed when it hangs past budget.trial_timeout), "
        "in a child kept warm between trials, or in this one; auto: process on CUDA, none on CPU",
    )
    run.add_argument(
        "--as-worker", type=int, metavar="I", help=argparse.SUPPRESS
    )  # set by --workers
    run.add_argument(
        "--allow-changes",
        action="store_true",
        help="go on with a study whose task, target, space, limits or device changed since it began",
    )
    run.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (bars on a terminal, else a line per trial); notices, errors and the report still print",
    )

    report = commands.add_parser(
        "report", help="summarize a study from its storage, without training"
    )
    report.add_argument(
        "study",
        nargs="?",
        help="study file (.yaml); or, for a study with none, --storage and --study",
    )
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as one self-contained HTML page with plots",
    )
    report.add_argument(
        "--csv",
        metavar="PATH",
        help="also write every trial, its parameters and measurements, as CSV",
    )
    report.add_argument("--storage", metavar="URL", help="database URL")
    report.add_argument(
        "--study",
        dest="study_name",
        metavar="NAME",
        help="with --storage and no study file: the study of that name (one autotune.tune() ran)",
    )
    report.add_argument(
        "--force",
        action="store_true",
        help="let --csv and --html write over a file autotune did not write (never the study file or its storage)",
    )

    from autotune.export import FORMATS  # a light import: the formats render text only

    export = commands.add_parser(
        "export",
        help="write the winning configuration",
        description="Write the winning configuration in another tool's terms. Formats: yaml, json: "
        "the flat settings; lightning: JSON sections for lightning.Trainer, DataLoader, "
        "optimizer and LR scheduler; hf: JSON keyword arguments for "
        "transformers.TrainingArguments; torch: a plain PyTorch module; args: one line "
        "of command-line flags. What a trainer has no equivalent for is named in notes.",
    )
    export.add_argument(
        "study",
        nargs="?",
        help="study file (.yaml); or, for a study with none, --storage and --study",
    )
    export.add_argument("--format", required=True, choices=FORMATS)
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.add_argument("--storage", metavar="URL", help="database URL")
    export.add_argument(
        "--study",
        dest="study_name",
        metavar="NAME",
        help="with --storage and no study file: the study of that name (one autotune.tune() ran)",
    )
    export.add_argument(
        "--force",
        action="store_true",
        help="let -o write over a file that is not an earlier export (never the study file or its storage)",
    )

    dashboard = commands.add_parser(
        "dashboard",
        help="browse the study in optuna-dashboard (optional extra: autotune[dashboard])",
    )
    dashboard.add_argument("study", help="study file (.yaml)")
    dashboard.add_argument("--storage", metavar="URL", help="database URL")
    dashboard.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s, this machine only)",
    )
    dashboard.add_argument(
        "--port", type=_port, default=8080, help="port to listen on (default: %(default)s)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _command(argv)
        finally:
            sys.stdout.flush()  # here, not at exit, where a closed pipe could only be reported as a traceback
    except BrokenPipeError:
        # The reader went away (`autotune report ... | head`): what it did not read is no error of
        # ours. Exit as a process that SIGPIPE stopped, as other command-line tools do.
        os.dup2(
            os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno()
        )  # Python flushes stdout once more at exit
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as interrupt:
        # Ctrl-C while torch imports or a study is read, before a run's own handler is in place:
        # one line, never a traceback. A run that began says what it saved itself.
        from autotune import signals

        if (
            signals.WORKERS_PARENT not in os.environ
        ):  # a worker's parent says it once for all of them
            print(f"\nautotune: interrupted ({signals.name(interrupt)})", file=sys.stderr)
        return signals.exit_code(interrupt)


def _command(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {
            "run": cmd_run,
            "report": cmd_report,
            "export": cmd_export,
            "dashboard": cmd_dashboard,
        }[args.command](args)
    except AutotuneError as exc:
        print(f"autotune: error: {exc}", file=sys.stderr)
        return exc.exit_code


def cmd_run(args: argparse.Namespace) -> int:
    from autotune import progress, signals
    from autotune.report import results
    from autotune.spec.study_file import load
    from autotune.study import preparation, storage, workers
    from autotune.study.run import run_sequence

    progress.set_mode(progress.choose(quiet=args.quiet, terminal=sys.stderr.isatty()))
    spec = load(
        args.study,
        storage=args.storage,
        isolation=args.isolation,
        trials=args.trials,
        timeout=args.timeout,
    )
    prepared = preparation.prepare(spec)  # every user error surfaces before the storage is touched
    if args.as_worker is not None:
        return _run_as_worker(args, spec, prepared)
    workers.check_storage(spec, args.workers)
    args.workers = workers.usable(spec, args.workers)
    in_workers = functools.partial(
        workers.run_workers,
        spec,
        study_file=args.study,
        workers=args.workers,
        options=[
            f"--isolation={spec.isolation}",
            *(["--allow-changes"] if args.allow_changes else []),
            *(["--quiet"] if args.quiet else []),
        ],
    )
    try:
        study = run_sequence(
            spec,
            prepared,
            allow_changes=args.allow_changes,
            run_trials=in_workers if args.workers > 1 else None,
        )
    except KeyboardInterrupt as interrupt:
        print(
            f"\nautotune: interrupted ({signals.name(interrupt)}); every finished trial is saved in {spec.storage}.\n"
            f"Resume with: {resume_command(args)}",
            file=sys.stderr,
        )
        return signals.exit_code(interrupt)
    except Exception as exc:
        if not storage.disk_full(exc):
            raise
        # SQLite rolled the failed write back: what was stored stays whole, and the trial that was
        # being written is marked interrupted and run again by the next start.
        raise StorageError(
            f"{spec.path}: storage {spec.storage}: no space left on the device; every trial finished "
            f"before is saved. Free some space, then resume with: {resume_command(args)}"
        ) from None
    print(_report_text(spec, study))
    failed = results.all_failed(study.get_trials(deepcopy=False))
    if failed:
        print(f"autotune: {failed}", file=sys.stderr)
        return 1
    progress.tell(
        f"autotune: plots, telemetry and per-class figures: autotune report {shlex.quote(args.study)} --html report.html"
    )
    return 0


def resume_command(args: argparse.Namespace) -> str:
    """The `autotune run` that goes on where this one stopped: the same options, quoted for a shell."""
    options = [
        ("--trials", args.trials),
        ("--timeout", args.timeout),
        ("--storage", args.storage),
        ("--workers", args.workers if args.workers > 1 else None),
        ("--isolation", args.isolation),
    ]
    words = ["autotune", "run", args.study]
    for name, value in options:
        if value is not None:
            words += [name, f"{value:g}" if isinstance(value, float) else str(value)]
    words += [
        flag
        for flag, given in (("--allow-changes", args.allow_changes), ("--quiet", args.quiet))
        if given
    ]
    return shlex.join(words)


def _run_as_worker(args: argparse.Namespace, spec: StudySpec, prepared: object) -> int:
    """One of `--workers K`: trials only; the parent recovers, confirms and reports."""
    from autotune import signals
    from autotune.study import preparation, runner_lock, storage, workers
    from autotune.study.run import run_study

    if spec.storage.startswith("sqlite"):
        raise AutotuneError(
            f"{spec.path}: --as-worker is for the processes that --workers starts, on a shared storage"
        )
    workers.die_with_parent()
    try:
        with signals.handled(), runner_lock.as_worker(spec, storage.local_path(spec.storage)):
            run_study(spec, preparation.as_begun(spec, prepared), worker=args.as_worker)
    except KeyboardInterrupt as interrupt:
        return signals.exit_code(interrupt)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune import outputs
    from autotune.report import html_page, results, text

    spec, study = _reported(args)
    wanted = [
        (option, Path(path), ours)
        for option, path, ours in (
            ("--csv", args.csv, results.looks_like_trials_csv),
            ("--html", args.html, html_page.looks_like_page),
        )
        if path
    ]
    for option, path, ours in wanted:  # every output checked before anything is written
        outputs.check(spec, path, option=option, ours=ours, force=args.force)
    records, summary = _summary(spec, study)
    for option, path, _ in wanted:
        outputs.write(
            path,
            records.to_csv(index=False) if option == "--csv" else _html(study, records, summary),
            option=option,
        )
    print(json.dumps(summary.as_dict(), indent=2) if args.json else text.render(summary, records))
    return 0


def _html(study: optuna.Study, records: pd.DataFrame, summary: Summary) -> str:
    """The HTML page, with what it needs from the storage beyond the summary."""
    from autotune.record import importance, schema
    from autotune.report import html_page, results, text

    top = results.best_feasible(records, count=text.TABLE_ROWS)
    curves = results.learning_curves(
        study.get_trials(deepcopy=False),
        [int(n) for n in top["number"]],
        confirmation=schema.confirmation(study.user_attrs),
    )
    values, why_not = importance.param_importances(study)
    return html_page.render(
        summary, records, curves=curves, importances=values, importances_missing=why_not
    )


def cmd_export(args: argparse.Namespace) -> int:
    from autotune import export, outputs

    spec, study = _reported(args)
    _, summary = _summary(spec, study)
    if summary.best is None:
        raise AutotuneError(
            f"{spec.path}: no trial has reached the target yet, so there is nothing to export"
        )
    text = export.render(summary, args.format)
    if args.output:
        outputs.check(
            spec, Path(args.output), option="-o", ours=export.looks_like_export, force=args.force
        )
        outputs.write(Path(args.output), text, option="-o")
    else:
        sys.stdout.write(text)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autotune import signals
    from autotune.spec.study_file import load
    from autotune.study import dashboard

    spec = load(args.study, storage=args.storage)
    try:
        dashboard.serve(spec, host=args.host, port=args.port)
    except KeyboardInterrupt as interrupt:
        return signals.exit_code(interrupt)  # Ctrl-C is how a dashboard ends: no traceback
    return 0


def _reported(args: argparse.Namespace) -> tuple[StudySpec, optuna.Study]:
    """The study a report or an export is of, opened: its study file's, or (--storage and --study,
    for a study with no file) the one its storage describes. A file that no longer says what the
    stored study began with gets a notice: the report reads the stored trials by the file's target."""
    from autotune.record import definition, schema
    from autotune.spec.study_file import load
    from autotune.study import storage

    where = f"autotune {args.command}"
    if args.study is None:
        if not (args.storage and args.study_name):
            raise AutotuneError(
                f"{where}: give a study file, or --storage URL with --study NAME for a study that "
                f"has none (one that autotune.tune() ran)"
            )
        spec = storage.spec_of_stored(args.storage, args.study_name)
        return spec, storage.open_study(spec, create=False)
    if args.study_name is not None:
        raise AutotuneError(
            f"{where}: --study {args.study_name} is for a stored study that has no study file; "
            f"with a study file, its name: key says which study it is"
        )
    spec = load(args.study, storage=args.storage)
    study = storage.open_study(spec, create=False)
    for change in definition.drifted(schema.definition(study.user_attrs), spec):
        print(
            f"autotune: notice: {spec.path}: differs from the stored study {spec.name!r} in {change}; "
            f"its trials are read by the file's target and limits",
            file=sys.stderr,
        )
    return spec, study


def _summary(spec: StudySpec, study: optuna.Study) -> tuple[pd.DataFrame, Summary]:
    from autotune.report import summarize

    return summarize.of_study(spec, study)


def _report_text(spec: StudySpec, study: optuna.Study) -> str:
    from autotune.report import text

    records, summary = _summary(spec, study)
    return text.render(summary, records)


if __name__ == "__main__":
    sys.exit(main())
