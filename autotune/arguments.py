"""The command line's arguments: `autotune run | report | export | dashboard` and what each
accepts, checked as argparse reads them; and the `autotune run` that repeats a run's."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any

from autotune import __version__
from autotune.spec.sections import MAX_SECONDS, MAX_TRIALS
from autotune.spec.study_file import ISOLATION_MODES


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
    _add_run(commands)
    _add_report(commands)
    _add_export(commands)
    _add_dashboard(commands)
    return parser


def _add_run(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        help="run each trial in a fresh child process (killed when it hangs past "
        "budget.trial_timeout), in a child kept warm between trials, or in this one; "
        "auto: process on CUDA, none on CPU",
    )
    # set by --workers
    run.add_argument("--as-worker", type=int, metavar="I", help=argparse.SUPPRESS)
    run.add_argument(
        "--allow-changes",
        action="store_true",
        help="go on with a study whose task, target, space, limits or device changed since it "
        "began",
    )
    run.add_argument(
        "--quiet",
        action="store_true",
        help="no progress on stderr (bars on a terminal, else a line per trial); notices, errors "
        "and the report still print",
    )


def _add_report(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = commands.add_parser(
        "report", help="summarize a study from its storage, without training"
    )
    _add_stored_study(report)
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as one self-contained HTML page with plots (-: standard "
        "output, in place of the text report)",
    )
    report.add_argument(
        "--csv",
        metavar="PATH",
        help="also write every trial, its parameters and measurements, as CSV (-: standard "
        "output, in place of the text report)",
    )
    report.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also write every stored learning curve (trials, confirmation runs) and the "
        "systems probe's measurements as TensorBoard event files under DIR (optional extra: "
        "autotune[tensorboard])",
    )
    report.add_argument(
        "--force",
        action="store_true",
        help="let --csv and --html write over a file autotune did not write (never the study "
        "file or its storage)",
    )


def _add_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.export import FORMATS  # a light import: the formats render text only

    export = commands.add_parser(
        "export",
        help="write the winning configuration",
        description="Write the winning configuration in another tool's terms. Formats: yaml, json: "
        "the flat settings; lightning: JSON sections for lightning.Trainer, DataLoader, "
        "optimizer and LR scheduler; hf: JSON keyword arguments for "
        "transformers.TrainingArguments; torch: a plain PyTorch module; args: one line "
        "of command-line flags; command: a command study's own command line, filled with the "
        "winner's values as its trial ran it. What a trainer has no equivalent for is named in "
        "notes.",
    )
    _add_stored_study(export)
    export.add_argument("--format", required=True, choices=FORMATS)
    export.add_argument("-o", "--output", help="file to write (default, or -: standard output)")
    export.add_argument(
        "--force",
        action="store_true",
        help="let -o write over a file that is not an earlier export (never the study file or "
        "its storage)",
    )


def _add_stored_study(command: argparse.ArgumentParser) -> None:
    """The study a reading command reads: its file, or a storage URL and a name."""
    command.add_argument(
        "study",
        nargs="?",
        help="study file (.yaml); or, for a study with none, --storage and --study",
    )
    command.add_argument("--storage", metavar="URL", help="database URL")
    command.add_argument(
        "--study",
        dest="study_name",
        metavar="NAME",
        help="with --storage and no study file: the study of that name (one autotune.tune() ran)",
    )


def _add_dashboard(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def resume_command(args: argparse.Namespace) -> str:
    """The `autotune run` that goes on where this one stopped: the same options, quoted for a
    shell."""
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
