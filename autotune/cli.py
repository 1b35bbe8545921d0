"""Command line: `autotune run | report | export | dashboard`. User errors become one line and
exit 2."""

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
from typing import TYPE_CHECKING

from autotune.errors import AutotuneError, StorageError

if TYPE_CHECKING:  # the heavy imports wait until a command needs them
    import optuna
    import pandas as pd

    from autotune.record.summary import Summary
    from autotune.spec.study_file import StudySpec


def main(argv: Sequence[str] | None = None) -> int:
    """The `autotune` command; `argv` None: this process is the command (sys.argv), and exits with
    what this returns."""
    if argv is None:
        _standard_streams()
    code = _main(argv)
    if argv is None and code == 128 + signal.SIGINT:
        from autotune import signals

        signals.stopping()  # the interpreter's exit comes next: a second Ctrl-C would break it
    return code


def _standard_streams() -> None:
    """Standard output and error as a study can use them, whatever the shell gave.

    A closed one (`>&-`, `2>&-`) is opened on /dev/null: what would be said there is lost, but the
    study runs, and no file opened later (the study's database) takes its descriptor number,
    where a library writing to "standard error" would write into it. One that cannot encode
    every character (PYTHONIOENCODING=ascii, an old terminal) writes escapes in their place."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor is this one
            opened = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _main(argv: Sequence[str] | None) -> int:
    try:
        try:
            return _command(argv)
        finally:
            # here, not at exit, where a closed pipe could only be reported as a traceback
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`autotune report ... | head`): what it did not read is no error of
        # ours. Exit as a process that SIGPIPE stopped, as other command-line tools do.
        # Python flushes stdout once more at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as interrupt:
        # Ctrl-C while torch imports or a study is read, before a run's own handler is in place:
        # one line, never a traceback. A run that began says what it saved itself.
        from autotune import signals

        # a worker's parent says it once for all of them
        if signals.WORKERS_PARENT not in os.environ:
            print(f"\nautotune: interrupted ({signals.name(interrupt)})", file=sys.stderr)
        return signals.exit_code(interrupt)


def _command(argv: Sequence[str] | None) -> int:
    # imported here, inside main's handling of Ctrl-C, as every import past the interpreter's own
    from autotune.arguments import build_parser

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
    from autotune import progress
    from autotune.spec.study_file import load

    progress.set_mode(progress.choose(quiet=args.quiet, terminal=sys.stderr.isatty()))
    # the study file is checked before torch is imported (seconds): a mistake in it is told at once
    spec = load(
        args.study,
        storage=args.storage,
        isolation=args.isolation,
        trials=args.trials,
        timeout=args.timeout,
    )
    from autotune import arguments, signals

    # A Ctrl-C that lands inside torch's import can abort the process with a C++ message
    # (pybind11::error_already_set): a signal sent meanwhile is taken once the import is done.
    with signals.held():
        from autotune.report import results
        from autotune.storage import faults
        from autotune.study import preparation
        from autotune.study.run import run_as_worker, run_sequence

    prepared = preparation.prepare(spec)  # every user error surfaces before the storage is touched
    if args.as_worker is not None:
        return run_as_worker(spec, prepared, worker=args.as_worker)
    run_trials = _in_workers(args, spec)
    try:
        study = run_sequence(
            spec, prepared, allow_changes=args.allow_changes, run_trials=run_trials
        )
    except KeyboardInterrupt as interrupt:
        print(
            f"\nautotune: interrupted ({signals.name(interrupt)}); every finished trial is saved "
            f"in {spec.storage}.\nResume with: {arguments.resume_command(args)}",
            file=sys.stderr,
        )
        return signals.exit_code(interrupt)
    except faults.StorageFault as fault:  # one line, with the command that resumes
        raise StorageError(fault.line(arguments.resume_command(args))) from None
    print(_report_text(spec, study))
    failed = results.all_failed(study.get_trials(deepcopy=False))
    if failed:
        print(f"autotune: {failed}", file=sys.stderr)
        return 1
    progress.tell(
        "autotune: plots, telemetry and per-class figures: "
        f"autotune report {shlex.quote(args.study)} --html report.html"
    )
    return 0


def _in_workers(args: argparse.Namespace, spec: StudySpec) -> Callable[[StudySpec], None] | None:
    """What runs the trials in the processes of `--workers`, as many as can be used (args.workers
    says how many, for the command that resumes); None where one process runs them all."""
    from autotune.study import workers

    workers.check_storage(spec, args.workers)
    args.workers = workers.usable(spec, args.workers)
    if args.workers == 1:
        return None
    # before the storage is touched: a count the GPUs cannot take is the user's to change
    gpus = workers.gpu_shares(spec, args.workers, workers.gpu_ids(spec))
    return functools.partial(
        workers.run_workers,
        study_file=args.study,
        workers=args.workers,
        gpus=gpus,
        options=[
            f"--isolation={spec.isolation}",
            *(["--allow-changes"] if args.allow_changes else []),
            *(["--quiet"] if args.quiet else []),
        ],
    )


def cmd_report(args: argparse.Namespace) -> int:
    spec, study = _reported(args)  # a mistake in the file is told before pandas and plots load
    from autotune import outputs
    from autotune.report import html_page, results, tensorboard, text

    wanted = [
        (option, Path(path), ours)
        for option, path, ours in (
            ("--csv", args.csv, results.looks_like_trials_csv),
            ("--html", args.html, html_page.looks_like_page),
        )
        if path
    ]
    to_stdout = [option for option, path, _ in wanted if path == outputs.STDOUT]
    if len(to_stdout) + bool(args.json) > 1:
        raise AutotuneError(
            f"autotune report: {' and '.join(to_stdout + ['--json'] * bool(args.json))} would all "
            f"write to standard output; give all but one a file"
        )
    for option, path, ours in wanted:  # every output checked before anything is written
        outputs.check_output(spec, path, option=option, ours=ours, force=args.force)
    if args.tensorboard:
        tensorboard.check_folder(Path(args.tensorboard))
    records, summary = _summary(spec, study)
    for option, path, _ in wanted:
        outputs.write(
            path,
            records.to_csv(index=False) if option == "--csv" else _html(study, records, summary),
            option=option,
        )
    if args.tensorboard:
        _tensorboard(spec, study, Path(args.tensorboard))
    if not to_stdout:  # else standard output holds the table or the page alone
        print(
            json.dumps(summary.as_dict(), indent=2) if args.json else text.render(summary, records)
        )
    return 0


def _tensorboard(spec: StudySpec, study: optuna.Study, folder: Path) -> None:
    from autotune import outputs
    from autotune.record import schema
    from autotune.report import tensorboard, tensorboard_probe

    protected = outputs.study_files(spec)
    written = tensorboard.write(
        folder,
        study.get_trials(deepcopy=False),
        schema.confirmation(study.user_attrs),
        metric=spec.target.metric,
        protected=protected,
    )
    settings = tensorboard_probe.write(folder, schema.probe(study.user_attrs), protected=protected)
    probed = f" and the probe's {settings} measured settings" if settings else ""
    print(
        f"autotune: {written} learning curves{probed} written for TensorBoard: "
        f"tensorboard --logdir {folder}",
        file=sys.stderr,
    )


def _html(study: optuna.Study, records: pd.DataFrame, summary: Summary) -> str:
    """The HTML page, with what it needs from the storage beyond the summary."""
    from autotune.record import importance, schema
    from autotune.report import html_page, results, text

    top = results.best_feasible(records, count=text.TABLE_ROWS)
    curves = results.stored_curves(
        study.get_trials(deepcopy=False),
        [int(n) for n in top["number"]],
        confirmation=schema.confirmation(study.user_attrs),
    )
    complete = summary.counts.complete
    if complete >= importance.MIN_TRIALS:  # seconds, where the rest of the page takes less
        print(
            f"autotune: parameter importances over {importance.sampled_from(complete):,} of "
            f"{complete:,} complete trials ...",
            file=sys.stderr,
            flush=True,
        )
    values, why_not = importance.param_importances(study)
    return html_page.render(
        summary, records, curves=curves, importances=values, importances_missing=why_not
    )


def cmd_export(args: argparse.Namespace) -> int:
    spec, study = _reported(args)
    from autotune import export, outputs

    _, summary = _summary(spec, study)
    if summary.best is None:
        raise AutotuneError(
            f"{spec.path}: no trial has reached the target yet, so there is nothing to export"
        )
    text = (
        _command_line(spec, study, summary)
        if args.format == "command"
        else export.render(summary, args.format)
    )
    if summary.best.is_baseline and summary.confirmation:  # what it writes is what the user has
        print(f"autotune: {summary.confirmation.why_baseline()}", file=sys.stderr)
    output = Path(args.output) if args.output else outputs.STDOUT
    outputs.check_output(spec, output, option="-o", ours=export.looks_like_export, force=args.force)
    outputs.write(output, text, option="-o")
    return 0


def _command_line(spec: StudySpec, study: optuna.Study, summary: Summary) -> str:
    """The winner's command line, from what the stored study's trials ran: its definition's task
    and device, the folder its study file names, the seed of the trial it is."""
    from autotune.export import command
    from autotune.record import schema, seeds
    from autotune.spec import command_task

    stored = schema.definition(study.user_attrs) or {}
    task = stored.get("task", spec.task if isinstance(spec.task, str) else spec.task.describe())
    best = summary.best
    assert best is not None
    ran = [
        t
        for t in study.get_trials(deepcopy=False)
        if (t.number == best.trial if best.trial is not None else schema.is_baseline(t))
    ]
    seed = next((s for s in map(schema.seed, ran) if s is not None), seeds.for_trial(spec.seed, 0))
    return command.render(
        summary,
        task=task,
        folder=command_task.folder(spec.path, task.get("cwd") if isinstance(task, dict) else None),
        seed=seed,
        device=stored.get("device", "cpu"),
        limits=stored.get("limits")
        or {"max_epochs": spec.budget.max_epochs, "eval_every": spec.budget.eval_every},
    )


def cmd_dashboard(args: argparse.Namespace) -> int:
    from autotune import signals
    from autotune.spec.study_file import load
    from autotune.storage import dashboard

    spec = load(args.study, storage=args.storage)
    try:
        dashboard.serve(spec, host=args.host, port=args.port)
    except KeyboardInterrupt as interrupt:
        return signals.exit_code(interrupt)  # Ctrl-C is how a dashboard ends: no traceback
    return 0


def _reported(args: argparse.Namespace) -> tuple[StudySpec, optuna.Study]:
    """The study a report or an export is of, opened: its study file's, or (--storage and --study,
    for a study with no file) the one its storage describes. A file that no longer says what the
    stored study began with gets a notice: the report reads the stored trials by the file's
    target."""
    from autotune.spec.study_file import load

    where = f"autotune {args.command}"
    spec = None if args.study is None else load(args.study, storage=args.storage)
    from autotune.record import definition, schema
    from autotune.storage import opening

    if spec is None:
        if not (args.storage and args.study_name):
            raise AutotuneError(
                f"{where}: give a study file, or --storage URL with --study NAME for a study that "
                f"has none (one that autotune.tune() ran)"
            )
        spec = opening.spec_of_stored(args.storage, args.study_name)
        return spec, opening.open_study(spec, create=False)
    if args.study_name is not None:
        raise AutotuneError(
            f"{where}: --study {args.study_name} is for a stored study that has no study file; "
            f"with a study file, its name: key says which study it is"
        )
    study = opening.open_study(spec, create=False)
    for change in definition.drifted(schema.definition(study.user_attrs), spec):
        print(
            f"autotune: notice: {spec.path}: differs from the stored study {spec.name!r} "
            f"in {change}; its trials are read by the file's target and limits",
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
