"""The user-facing contract for bad input, through the real console entry point.

Every case: exit status 2, one line on stderr naming the file, no traceback, nothing on stdout,
and the study's storage untouched (not created, or byte-for-byte as it was).
Most cases run autotune's `main` in this process, as the hostile rounds do (a process of its own
would import torch again, 4 s a case); those that need a process of their own start the console
entry point itself (a closed pipe, an import check) or a small one beside it (a lock held).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_hostile_round import cli

REPO = Path(__file__).resolve().parent.parent
HEAD = "task: digits\ntarget: {metric: accuracy, value: 0.97}\n"
TARGET = "target: {metric: accuracy, value: 0.97}\n"
GARBAGE = b"not an sqlite database \x00\x01\x02 keep me as I am\n"


def foreign_sqlite() -> bytes:
    """The bytes of another application's SQLite database."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "other.db"
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute("create table invoices (id integer primary key, amount real)")
            connection.execute("insert into invoices (amount) values (12.5)")
            connection.commit()
        return path.read_bytes()


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, f"exit {result.returncode}; stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "", result.stdout


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """Exit 2, no traceback, exactly one non-empty stderr line containing every fragment."""
    assert_no_traceback(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), (
        f"expected one line on stderr, got:\n{result.stderr}"
    )
    line = lines[0]
    assert line.startswith("autotune: error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad invocation: the study file (None: not written), what the error line must say."""

    id: str
    study: str | None
    fragments: tuple[str, ...]
    command: str = "run"
    options: tuple[str, ...] = ()  # after the study file
    files: tuple[tuple[str, str], ...] = ()  # other files beside the study (a user's task module)
    storage: bytes | None = None  # pre-existing bytes in study.db, which must survive unchanged


CASES = [
    Case(
        "malformed yaml",
        HEAD + "space: {lr: [0.1, 0.2}\n",
        ("(yaml)", "not valid YAML"),
        storage=GARBAGE,
    ),
    Case(
        "unknown top-level key",
        HEAD + "budjet: {trials: 3}\n",
        ("budjet", "did you mean 'budget'?"),
        storage=GARBAGE,
    ),
    Case(
        "trials is text",
        HEAD + "budget: {trials: ten}\n",
        ("budget.trials: got 'ten'", "from 1 to 1,000,000"),
    ),
    Case(
        "unknown knob",
        HEAD + "space: {batchsize: [32]}\n",
        ("space.batchsize", "did you mean 'batch_size'?"),
    ),
    Case(
        "inverted range",
        HEAD + "space: {lr: {low: 0.5, high: 0.1}}\n",
        ("space.lr", "0.5", "low < high"),
    ),
    Case(
        "unknown scheduler",
        HEAD + "space: {scheduler: [linear]}\n",
        ("space.scheduler[0]: got 'linear'", "onecycle"),
    ),
    Case("bad device", HEAD + "device: gpu\n", ("device: got 'gpu'", "cuda:N")),
    Case(
        "bad storage url", HEAD + "storage: study.db\n", ("storage: got 'study.db'", "sqlite:///")
    ),
    Case(
        "unknown baseline key",
        HEAD + "baseline: {batchsize: 64}\n",
        ("baseline.batchsize", "batch_size"),
    ),
    Case(
        "confirm runs negative",
        HEAD + "confirm: {runs: -1}\n",
        ("confirm.runs: got -1", "from 0 to 1000"),
    ),
    Case("unknown task name", "task: nosuch\n" + TARGET, ("task: got 'nosuch'", "digits")),
    Case(
        "task module missing",
        "task: nosuchmodule_xyz:task\n" + TARGET,
        ("task", "ModuleNotFoundError: No module named 'nosuchmodule_xyz'"),
        storage=GARBAGE,
    ),
    Case(
        "task module raises ImportError",
        "task: badmod_xyz:task\n" + TARGET,
        ("task", "ImportError: broken dependency libfoo"),
        files=(("badmod_xyz.py", 'raise ImportError("broken dependency libfoo")\n'),),
        storage=GARBAGE,
    ),
    Case(
        "fp16 only on cpu",
        HEAD + "device: cpu\nspace: {precision: fp16}\n",
        ("space.precision", "fp16", "cpu"),
        storage=GARBAGE,
    ),
    Case("missing study file", None, ("(file)", "no such file")),
    Case(
        "report before any run",
        HEAD,
        ("storage", "no study database", "autotune run"),
        command="report",
    ),
    Case(
        "report on a corrupt storage",
        HEAD,
        ("storage", "cannot open"),
        command="report",
        storage=GARBAGE,
    ),
    # More of the study file: each section's own mistakes.
    Case("empty study file", "", ("(top level): got None", "a mapping")),
    Case("study file is a list", "- task: digits\n", ("(top level)", "a mapping")),
    Case("target missing", "task: digits\n", ("target",), storage=GARBAGE),
    Case(
        "target value is text",
        "task: digits\ntarget: {metric: accuracy, value: high}\n",
        ("target.value", "'high'"),
    ),
    Case(
        "misspelt budget key",
        HEAD + "budget: {max_epoch: 3}\n",
        ("budget.max_epoch", "did you mean 'max_epochs'?"),
    ),
    Case(
        "negative max_seconds",
        HEAD + "budget: {max_seconds: -5}\n",
        ("budget.max_seconds: got -5",),
    ),
    Case("negative timeout in file", HEAD + "budget: {timeout: -1}\n", ("budget.timeout: got -1",)),
    Case("empty range", HEAD + "space: {lr: {low: 0.1, high: 0.1}}\n", ("space.lr", "low < high")),
    Case("empty list of choices", HEAD + "space: {batch_size: []}\n", ("space.batch_size", "[]")),
    Case(
        "unknown precision",
        HEAD + "space: {precision: [fp32, fp8]}\n",
        ("space.precision[1]: got 'fp8'", "bf16"),
    ),
    Case(
        "pin_memory as text",
        HEAD + "space: {pin_memory: 'yes'}\n",
        ("space.pin_memory", "true or false"),
    ),
    Case(
        "negative workers",
        HEAD + "space: {num_workers: [-1, 2]}\n",
        ("space.num_workers[0]: got -1", "at least 0"),
    ),
    Case("unknown preset", HEAD + "space: {preset: fastest}\n", ("space.preset", "fastest")),
    Case(
        "param the task does not take",
        HEAD + "space: {params: {depth: [2, 3]}}\n",
        ("space.params.depth", "neither the task's model factory nor its optimizer"),
        storage=GARBAGE,
    ),
    Case(
        "param named like a knob",
        HEAD + "space: {params: {batch_size: [8]}}\n",
        ("space.params.batch_size", "knobs"),
    ),
    Case(
        "task factory fails",
        "task: failing_xyz:task\n" + TARGET,
        ("task", "RuntimeError: no data in /data/train"),
        files=(
            ("failing_xyz.py", 'def task():\n    raise RuntimeError("no data in /data/train")\n'),
        ),
        storage=GARBAGE,
    ),
    # Storage: unsupported, unreachable, unwritable, corrupt, busy, changed.
    Case(
        "unsupported storage scheme",
        HEAD + "storage: redis://localhost/0\n",
        ("storage: got 'redis://localhost/0'", "sqlite:///"),
    ),
    Case(
        "unreachable database server",
        HEAD + "storage: postgresql://autotune@127.0.0.1:9/nowhere\n",
        ("storage", "cannot open postgresql://autotune@127.0.0.1:9/nowhere"),
    ),
    Case(
        "storage folder missing",
        HEAD + "storage: sqlite:///no/such/folder/study.db\n",
        ("storage", "cannot write"),
    ),
    Case(
        "storage folder is a file",
        HEAD + "storage: sqlite:///study.yaml/study.db\n",
        ("storage", "cannot write"),
    ),
    Case(
        "journal folder missing",
        HEAD + "storage: journal:///no/such/folder/study.journal\n",
        ("storage", "cannot write"),
    ),
    Case(
        "unknown isolation",
        HEAD + "isolation: thread\n",
        ("isolation: got 'thread'", "warm (a child kept between trials"),
    ),
    Case(
        "negative trial timeout",
        HEAD + "budget: {trial_timeout: -1}\n",
        ("budget.trial_timeout: got -1",),
    ),
    Case(
        "workers on a SQLite file",
        HEAD,
        ("--workers 2", "SQLite", "journal:///"),
        options=("--workers", "2"),
        storage=GARBAGE,
    ),
    # Values no trial could run with: refused before the first one, not failed in every one.
    Case(
        "key given twice",
        HEAD + "space:\n  lr: 0.1\n  lr: 0.2\n",
        ("lr (line 5)", "given twice"),
        storage=GARBAGE,
    ),
    Case(
        "a thousand loader workers",
        HEAD + "space: {num_workers: [1000, 2000]}\n",
        ("space.num_workers: got 1000", "CPU core", "loader workers"),
        storage=GARBAGE,
    ),
    Case(
        "accuracy target above 1",
        "task: digits\ntarget: {metric: accuracy, value: 1.5}\n",
        ("target.value: got 1.5", "at most 1"),
        storage=GARBAGE,
    ),
    Case(
        "checkpointing a share above 1",
        HEAD + "space: {checkpointing: [false, 1.5]}\n",
        ("space.checkpointing[1]: got 1.5", "a fraction between 0 and 1"),
        storage=GARBAGE,
    ),
    Case(
        "a DDP bucket of 0 MB",
        HEAD + "devices_per_trial: 2\nspace: {ddp_bucket_cap_mb: 0}\n",
        ("space.ddp_bucket_cap_mb: got 0", "a whole number of at least 1"),
        storage=GARBAGE,
    ),
    Case(
        "DDP's static graph fixed on, on one device",
        HEAD + "space: {ddp_static_graph: true}\n",
        ("space.ddp_static_graph: got [True]", "only with devices_per_trial > 1"),
        storage=GARBAGE,
    ),
    Case(
        "checkpointing only, for a model without checkpoint_blocks()",
        "task: tests.tasks:blobs\n" + TARGET + "space: {checkpointing: true}\n",
        ("space.checkpointing", "true is not possible here", "no checkpoint_blocks()"),
        storage=GARBAGE,
    ),
    Case(
        "every batch larger than the training set",
        HEAD + "space: {batch_size: [4096, 8192]}\n",
        ("space.batch_size: got 4096", "training samples"),
        storage=GARBAGE,
    ),
    Case(
        "another application's SQLite database",
        HEAD,
        ("storage", "study.db is an SQLite database of something else", "invoices"),
        storage=foreign_sqlite(),
    ),
    Case(
        "report from another application's database",
        HEAD,
        ("storage", "SQLite database of something else"),
        command="report",
        storage=foreign_sqlite(),
    ),
    Case("run on a corrupt storage", HEAD, ("storage", "cannot open", "study.db"), storage=GARBAGE),
    Case(
        "export before any run",
        HEAD,
        ("storage", "no study database"),
        command="export",
        options=("--format", "json"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_leaves_storage_alone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: Case,
) -> None:
    """Exit 2, one stderr line naming study.yaml, no traceback; study.db not created or
    unchanged."""
    if case.study is not None:
        (tmp_path / "study.yaml").write_text(case.study)
    for name, text in case.files:
        (tmp_path / name).write_text(text)
    storage = tmp_path / "study.db"
    if case.storage is not None:
        storage.write_bytes(case.storage)

    monkeypatch.chdir(tmp_path)
    said = cli(capsys, case.command, "study.yaml", *case.options)
    result = subprocess.CompletedProcess(case.command, said.code, said.out, said.err)

    assert_one_line_error(result, "study.yaml", *case.fragments)
    if case.storage is None:
        assert not storage.exists(), "a failed command created the storage"
    else:
        assert storage.read_bytes() == case.storage, "a failed command changed the storage"


# Argument errors are argparse's: a usage block, then one error line naming the option.
ARGUMENT_CASES = [
    ("trials zero", ("--trials", "0"), "argument --trials", "'0'"),
    (
        "trials past what a study counts",
        ("--trials", "10000000000"),
        "argument --trials",
        "from 1 to 1,000,000",
    ),
    (
        "timeout past what a wait holds",
        ("--timeout", "1e300"),
        "argument --timeout",
        "at most 10,000,000",
    ),
    ("timeout negative", ("--timeout", "-1"), "argument --timeout", "'-1'"),
    ("trials negative", ("--trials", "-3"), "argument --trials", "'-3'"),
    ("trials fractional", ("--trials", "2.5"), "argument --trials", "'2.5'"),
    ("timeout zero", ("--timeout", "0"), "argument --timeout", "'0'"),
    ("timeout not a number", ("--timeout", "soon"), "argument --timeout", "'soon'"),
]


@pytest.mark.parametrize(
    ("args", "option", "value"),
    [case[1:] for case in ARGUMENT_CASES],
    ids=[case[0] for case in ARGUMENT_CASES],
)
def test_bad_option_is_rejected_before_anything_runs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    option: str,
    value: str,
) -> None:
    """Exit 2, no traceback, the last line names the option and the value; no storage created."""
    (tmp_path / "study.yaml").write_text(HEAD)
    monkeypatch.chdir(tmp_path)

    said = cli(capsys, "run", "study.yaml", *args)
    result = subprocess.CompletedProcess("run", said.code, said.out, said.err)

    assert_no_traceback(result)
    assert result.stderr.startswith("usage: autotune run"), result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("autotune run: error: ") and option in last and value in last, last
    assert not (tmp_path / "study.db").exists()


HOLD_LOCK = """
import fcntl, sys
with open(sys.argv[1], "w") as lock:
    fcntl.lockf(lock, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_study_run_by_another_process_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second `autotune run` on a SQLite study that one already runs: refused, storage
    unchanged."""
    (tmp_path / "study.yaml").write_text(HEAD)
    (tmp_path / "study.db").write_bytes(GARBAGE)
    # A POSIX lock is a process's: the other run is a small process of its own that holds it as a
    # running `autotune run` does, and this one runs `main` here.
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "study.db.runner.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        monkeypatch.chdir(tmp_path)
        said = cli(capsys, "run", "study.yaml")
    finally:
        holder.stdin.close()  # it lets go and ends
        holder.wait(timeout=60)
    result = subprocess.CompletedProcess("run", said.code, said.out, said.err)
    assert_one_line_error(result, "study.yaml", "is being run by", "journal")
    assert (tmp_path / "study.db").read_bytes() == GARBAGE


@pytest.mark.parametrize(
    "command, url", [("report", "sqlite:///folder"), ("run", "journal:///folder")]
)
def test_a_directory_given_as_the_storage_is_named_as_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    url: str,
) -> None:
    """Not "no study database there; run autotune run first" (the very command): it is a directory,
    and a file in it is what --storage takes."""
    (tmp_path / "study.yaml").write_text(HEAD)
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    said = cli(capsys, command, "study.yaml", "--storage", url)
    result = subprocess.CompletedProcess(command, said.code, said.out, said.err)
    line = assert_one_line_error(
        result, "study.yaml", "folder is a directory", f"--storage {url.partition(':')[0]}:///"
    )
    assert "autotune run" not in line
    assert list((tmp_path / "folder").iterdir()) == []


def test_a_study_file_changed_since_the_study_began_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stored study began with target 0.9; the file now says 0.97: refused, storage
    unchanged."""
    import optuna

    from autotune.spec.study_file import load
    from autotune.study import preparation

    path = tmp_path / "study.yaml"
    path.write_text(HEAD.replace("0.97", "0.9") + "device: cpu\n")
    began = preparation.prepare(load(path)).definition
    stored = optuna.create_study(study_name="study", storage=f"sqlite:///{tmp_path / 'study.db'}")
    stored.set_user_attr("definition", began)
    before = (tmp_path / "study.db").read_bytes()
    path.write_text(HEAD + "device: cpu\n")

    monkeypatch.chdir(tmp_path)
    said = cli(capsys, "run", "study.yaml")
    result = subprocess.CompletedProcess("run", said.code, said.out, said.err)

    assert_one_line_error(
        result,
        "study.yaml",
        "changed since study 'study' began",
        "target.value: 0.9 -> 0.97",
        "--allow-changes",
    )
    assert (tmp_path / "study.db").read_bytes() == before


def test_a_reader_that_goes_away_ends_report_and_export_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`autotune report ... | head -1`: the pipe closes before autotune writes; exit as SIGPIPE
    would end it (141), nothing on stderr."""
    (tmp_path / "study.yaml").write_text(
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.5}\nprobe: none\n"
        "space: {num_workers: 0, batch_size: 64}\nbudget: {trials: 1, max_epochs: 2}\n"
        "confirm: {top: 0}\n"
    )
    monkeypatch.chdir(tmp_path)
    ran = cli(capsys, "run", "study.yaml", "--quiet")  # here: only the readers need a process
    assert ran.code == 0, ran.err
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    children = []
    for args in (["report", "study.yaml"], ["export", "study.yaml", "--format", "json"]):
        child = subprocess.Popen(
            [sys.executable, "-m", "autotune", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        child.stdout.close()  # long before the child has imported torch, let alone written
        children.append((args, child))
    for args, child in children:  # both at once
        stderr = child.stderr.read()
        assert child.wait(timeout=120) == 141 and stderr == "", (args, stderr)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "studies/x.yaml"], "autotune run studies/x.yaml"),
        (
            [
                "run",
                "my studies/x.yaml",
                "--trials",
                "30",
                "--timeout",
                "600",
                "--isolation",
                "process",
                "--allow-changes",
                "--storage",
                "journal:///x.journal",
                "--workers",
                "2",
                "--quiet",
            ],
            "autotune run 'my studies/x.yaml' --trials 30 --timeout 600 "
            "--storage journal:///x.journal --workers 2 --isolation process --allow-changes "
            "--quiet",
        ),
        (["run", "x.yaml", "--timeout", "90.5"], "autotune run x.yaml --timeout 90.5"),
    ],
)
def test_the_resume_line_repeats_every_option_and_quotes_paths(
    argv: list[str], expected: str
) -> None:
    from autotune.arguments import build_parser, resume_command

    assert resume_command(build_parser().parse_args(argv)) == expected


def test_a_mistake_in_the_study_file_is_told_before_torch_optuna_or_pandas_is_imported(
    tmp_path: Path,
) -> None:
    """Those imports take seconds; a mistake in the file needs none of them to be told."""
    bad = tmp_path / "study.yaml"
    bad.write_text(HEAD + "budget: {trials: many}\n")
    code = (
        "import sys\nfrom autotune.cli import main\n"
        f"codes = [main([*c, {str(bad)!r}]) for c in (['run'], ['report'], ['export', '--format', "
        "'json'])]\n"
        "print(codes, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'optuna', "
        "'pandas'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[2, 2, 2] []", result.stderr
    assert result.stderr.count("budget.trials") == 3
