"""A hostile round: bad study files, options, storages, outputs, signals, tasks, commands and
`autotune.tune` misuse, each checked against the contract the documents promise.

A user's mistake: exit status 2 (or the status the reference gives for the case), exactly one line
on stderr starting `autotune: error: ` that names the file or key, no traceback, nothing on
stdout, every study file and storage that was there byte for byte as it was, and no process left
behind. Most cases call the CLI in this process (`autotune.cli.main`), as importing torch in a
fresh process costs seconds; only signals, concurrency and the real crash cases start one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main

REPO = Path(__file__).resolve().parent.parent
SPEAKS = REPO / "tests" / "hostile" / "commands" / "speaks.py"
# in the environment of every process a case starts: what is left is found by it
TAG = "AUTOTUNE_HOSTILE_TAG"
STARTED = (
    "AUTOTUNE_HOSTILE_STARTED"  # tests/hostile/tasks.py:slow touches this file once training runs
)

TARGET = "target: {metric: accuracy, value: 0.9}\n"
HEAD = "task: tests.tasks:blobs\n" + TARGET
# Every knob the CPU cannot vary fixed, so that a run prints no notices: what stderr holds is the
# case's.
QUIET_SPACE = (
    "space: {lr: {low: 0.05, high: 0.5, log: true}, scheduler: constant, batch_size: [32, 64], "
    "accumulation_steps: 1, num_workers: 0, pin_memory: false, precision: fp32, "
    "channels_last: false, compile: false, cudnn_benchmark: false, tf32: false, "
    "fused_optimizer: false}\n"
)
TINY = "probe: none\nbudget: {trials: 2, max_epochs: 1}\nconfirm: {top: 0}\n"
EASY = (
    "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.5}\n"
    + QUIET_SPACE
    + "probe: none\nbudget: {trials: 2, max_epochs: 2}\nconfirm: {top: 0}\n"
)
GARBAGE = b"not a database \x00\x01\x02 keep me as I am\n"


# ---------------------------------------------------------------------------------------------
# Helpers


@dataclasses.dataclass(frozen=True)
class Result:
    code: int | None
    out: str
    err: str


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> Result:
    """`autotune ARGS` in this process. argparse's usage errors exit through SystemExit, as the
    console script does; any other exception would reach the user as a traceback: a failure."""
    capsys.readouterr()
    raised = None
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - the point of the check
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raised = f"{type(exc).__name__}: {str(exc)[:500]} (at {where.filename}:{where.lineno})"
    out, err = capsys.readouterr()
    if raised is not None:
        pytest.fail(
            f"autotune {' '.join(args)} raised {raised} instead of returning an exit status: "
            f"the user sees a traceback. stderr before it:\n{err[-1500:]}",
            pytrace=False,
        )
    return Result(code, out, err)


def assert_refused(result: Result, *fragments: str) -> str:
    """Exit 2, nothing on stdout, no traceback, one stderr line `autotune: error: ...` holding every
    fragment."""
    assert "Traceback" not in result.err + result.out, result.err
    assert result.code == 2, f"exit {result.code}; stderr:\n{result.err}"
    assert result.out == "", f"stdout is not empty:\n{result.out[:2000]}"
    lines = result.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.err[-3000:]}"
    line = lines[0]
    assert line.startswith("autotune: error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line[:3000]!r}"
    return line


def assert_usage_error(result: Result, *fragments: str) -> str:
    """argparse's mistaken option: exit 2, its usage line(s), then one error line holding every
    fragment."""
    assert "Traceback" not in result.err + result.out, result.err
    assert result.code == 2, f"exit {result.code}; stderr:\n{result.err}"
    assert result.out == "", result.out
    assert result.err.startswith("usage: autotune"), result.err
    last = result.err.strip().splitlines()[-1]
    assert ": error: " in last and last.startswith("autotune"), last
    for fragment in fragments:
        assert fragment in last, f"{fragment!r} not in {last!r}"
    return last


def snapshot(folder: Path) -> dict[str, Any]:
    """Every entry under `folder` (caches aside): a file's bytes, a link's target, a folder's
    name."""
    seen: dict[str, Any] = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*names, *dirs]:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                seen[key] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[key] = "dir"
            elif path.is_file():
                seen[key] = path.read_bytes()
            else:
                seen[key] = "special"
    return seen


def assert_unchanged(before: dict[str, Any], folder: Path) -> None:
    after = snapshot(folder)
    added, removed = sorted(set(after) - set(before)), sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (added or removed or changed), (
        f"files added {added}, removed {removed}, changed {changed}"
    )


def tagged_processes(tag: str) -> list[str]:
    """Processes other than this one whose environment holds TAG=tag: what a case left behind."""
    found = []
    needle = f"{TAG}={tag}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            state = stat.rsplit(")", 1)[1].split()[0]
            found.append(
                f"pid {entry} ({state}): {Path(f'/proc/{entry}/cmdline').read_bytes()[:200]!r}"
            )
    return found


def assert_nothing_left(tag: str, *, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A tag in this process's environment, so every process a case starts carries it; checked
    after."""
    value = uuid.uuid4().hex
    monkeypatch.setenv(TAG, value)
    yield value
    assert_nothing_left(value)


@dataclasses.dataclass(frozen=True)
class Stored:
    """A finished study (a winner reached the target): its file's text, its SQLite and journal
    bytes."""

    study: str
    db: bytes
    journal: bytes


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    folder = tmp_path_factory.mktemp("stored")
    (folder / "study.yaml").write_text(EASY)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()) as err,
        ):
            codes = [
                main(["run", "study.yaml", "--quiet"]),
                main(["run", "study.yaml", "--quiet", "--storage", "journal:///study.journal"]),
            ]
    finally:
        os.chdir(cwd)
    assert codes == [0, 0], err.getvalue()
    return Stored(
        study=EASY,
        db=(folder / "study.db").read_bytes(),
        journal=(folder / "study.journal").read_bytes(),
    )


def place(folder: Path, stored: Stored, *, journal: bool = False) -> None:
    """The finished study in `folder`: study.yaml, study.db (and study.journal)."""
    (folder / "study.yaml").write_text(stored.study)
    (folder / "study.db").write_bytes(stored.db)
    if journal:
        (folder / "study.journal").write_bytes(stored.journal)


def trials_of(folder: Path, *, storage: str | None = None, name: str = "study") -> list[Any]:
    import optuna

    return optuna.load_study(
        study_name=name, storage=storage or f"sqlite:///{folder / 'study.db'}"
    ).get_trials()


def finished(trials: list[Any]) -> int:
    from autotune.study.budget import finished_count

    return finished_count(trials)


def reasons(trials: list[Any]) -> list[str]:
    return [t.user_attrs.get("reason", "") for t in trials]


# ---------------------------------------------------------------------------------------------
# 1. Study files: each wrong in one way, at every level; run beside a study stored before.


@dataclasses.dataclass(frozen=True)
class Bad:
    id: str
    text: str | bytes
    fragments: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # more files beside the study (a preset)
    named: str = "study.yaml"  # the file the error names: a preset's own mistakes name the preset


def _bomb() -> str:
    """A 'billion laughs' of aliases: six lines that stand for a million strings."""
    levels = ["&a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcde", "bcdef"):
        levels.append(f"&{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    return "[" + ", ".join(levels) + "]"


PRESET = (REPO / "autotune" / "search" / "presets" / "default.yaml").read_text()

FILE_CASES = [
    # YAML itself
    Bad(
        "nesting thousands deep",
        HEAD + "space: {params: {width: " + "[" * 3000 + "]" * 3000 + "}}\n",
        ("(yaml)",),
    ),
    Bad("a mapping key that is a list", HEAD + "? [lr, batch_size]\n: 0.1\n", ("(yaml)",)),
    Bad("a mapping key that is a mapping, in space", HEAD + "space: {{lr: 1}: 0.1}\n", ("(yaml)",)),
    Bad("two documents", HEAD + "---\n" + HEAD, ("(yaml)", "not valid YAML")),
    Bad(
        "a tab between a key and its value",
        HEAD + "budget: {trials:\t2}\n",
        ("(yaml)", "line 3", "not valid YAML"),
    ),
    Bad("a Latin-1 byte in a comment", HEAD.encode() + b"# caf\xe9 au lait\n", ("(file)", "UTF-8")),
    Bad("UTF-16 with its byte order mark", HEAD.encode("utf-16"), ("(file)", "UTF-8")),
    Bad("a NUL byte inside a value", HEAD + "name: a\x00b\n", ("(yaml)", "not valid YAML")),
    Bad("the document is a plain scalar", "just some text\n", ("(top level)", "a mapping")),
    Bad(
        "an alias to the target reused as the budget",
        "task: tests.tasks:blobs\ntarget: &t {metric: accuracy, value: 0.9}\nbudget: *t\n",
        ("budget.metric", "unknown key"),
    ),
    Bad(
        "a key twice inside target",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.9, value: 0.5}\n",
        ("value (line 2)", "given twice"),
    ),
    Bad(
        "a key twice inside a parameter's range",
        HEAD + "space:\n  params:\n    width: {low: 8, high: 64, low: 4}\n",
        ("low (line 5)", "given twice"),
    ),
    Bad(
        "a key twice inside budget",
        HEAD + "budget: {trials: 2, trials: 3}\n",
        ("trials (line 3)", "given twice"),
    ),
    Bad("a top-level key that is a number", HEAD + "3: three\n", ("unknown key", "accepted keys")),
    Bad("a top-level key that is null", HEAD + "~: nothing\n", ("unknown key", "accepted keys")),
    # top-level values
    Bad("name is a number", HEAD + "name: 7\n", ("name: got 7", "non-empty string")),
    Bad("name is yes (a YAML boolean)", HEAD + "name: yes\n", ("name: got True",)),
    Bad("seed is infinite", HEAD + "seed: .inf\n", ("seed: got inf", "whole number")),
    Bad("seed is text", HEAD + "seed: '7'\n", ("seed: got '7'", "whole number")),
    Bad("seed is true", HEAD + "seed: true\n", ("seed: got True",)),
    Bad("device is the number 0", HEAD + "device: 0\n", ("device: got 0", "cuda:N")),
    Bad("device in capitals", HEAD + "device: CPU\n", ("device: got 'CPU'", "auto, cpu")),
    Bad("device cuda: without an index", HEAD + "device: 'cuda:'\n", ("device: got 'cuda:'",)),
    Bad(
        "isolation capitalised", HEAD + "isolation: Process\n", ("isolation: got 'Process'", "warm")
    ),
    Bad("isolation true", HEAD + "isolation: true\n", ("isolation: got True", "none")),
    Bad("probe: no (a YAML boolean)", HEAD + "probe: no\n", ("probe: got False", "joint")),
    Bad("prune: off (a YAML boolean)", HEAD + "prune: off\n", ("prune: got False", "incumbent")),
    Bad(
        "objective as a list",
        HEAD + "objective: [goodput]\n",
        ("objective: got ['goodput']", "time_to_target"),
    ),
    Bad(
        "first_trial misspelt",
        HEAD + "first_trial: baselin\n",
        ("first_trial: got 'baselin'", "prior"),
    ),
    Bad("replicates 21", HEAD + "replicates: 21\n", ("replicates: got 21", "1 to 20")),
    Bad("replicates as text", HEAD + "replicates: '3'\n", ("replicates: got '3'", "1 to 20")),
    Bad("task as a list", "task: [digits]\n" + TARGET, ("task: got ['digits']",)),
    Bad("task empty", "task: ''\n" + TARGET, ("task: got ''",)),
    # target
    Bad(
        "target value exactly 0",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0}\n",
        ("target.value: got 0", "above 0"),
    ),
    Bad(
        "target value just above 1",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 1.0000001}\n",
        ("target.value: got 1.0000001", "at most 1"),
    ),
    Bad(
        "target value true",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: true}\n",
        ("target.value: got True",),
    ),
    Bad(
        "target value infinite",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: .inf}\n",
        ("target.value: got inf", "finite"),
    ),
    Bad(
        "target without a value",
        "task: tests.tasks:blobs\ntarget: {metric: accuracy}\n",
        ("target.value: got None",),
    ),
    Bad(
        "target metric empty",
        "task: tests.tasks:blobs\ntarget: {metric: '', value: 0.9}\n",
        ("target.metric: got ''",),
    ),
    Bad(
        "target metric the task does not measure",
        "task: tests.tasks:blobs\ntarget: {metric: f1, value: 0.9}\n",
        ("target.metric: got 'f1'", "accuracy"),
    ),
    Bad(
        "target as a list",
        "task: tests.tasks:blobs\ntarget: [accuracy, 0.9]\n",
        ("target: got ['accuracy', 0.9]", "metric"),
    ),
    # budget
    Bad(
        "trials 1e3 (text to YAML)",
        HEAD + "budget: {trials: 1e3}\n",
        ("budget.trials: got '1e3'", "whole number"),
    ),
    Bad("trials negative", HEAD + "budget: {trials: -3}\n", ("budget.trials: got -3", "from 1")),
    Bad(
        "max_seconds zero",
        HEAD + "budget: {max_seconds: 0}\n",
        ("budget.max_seconds: got 0", "greater than 0"),
    ),
    Bad("eval_every NaN", HEAD + "budget: {eval_every: .nan}\n", ("budget.eval_every", "finite")),
    Bad(
        "trial_timeout zero",
        HEAD + "budget: {trial_timeout: 0}\n",
        ("budget.trial_timeout: got 0", "greater than 0"),
    ),
    Bad("timeout false", HEAD + "budget: {timeout: false}\n", ("budget.timeout: got False",)),
    Bad(
        "max_epochs a list",
        HEAD + "budget: {max_epochs: [1, 2]}\n",
        ("budget.max_epochs: got [1, 2]",),
    ),
    # confirm
    Bad(
        "confirm top fractional",
        HEAD + "confirm: {top: 1.5}\n",
        ("confirm.top: got 1.5", "whole number"),
    ),
    Bad(
        "confirm runs true",
        HEAD + "confirm: {runs: true}\n",
        ("confirm.runs: got True", "whole number"),
    ),
    Bad(
        "confirm baseline unknown",
        HEAD + "confirm: {baseline: some}\n",
        ("confirm.baseline: got 'some'", "until_resolved"),
    ),
    Bad("confirm a number", HEAD + "confirm: 3\n", ("confirm: got 3", "a mapping")),
    # space, presets and params
    Bad(
        "lr bound is a word",
        HEAD + "space: {lr: {low: tiny, high: 0.1}}\n",
        ("space.lr.low: got 'tiny'",),
    ),
    Bad("lr true", HEAD + "space: {lr: true}\n", ("space.lr: got True", "finite number")),
    Bad(
        "lr choice negative",
        HEAD + "space: {lr: [-0.1, 0.1]}\n",
        ("space.lr[0]: got -0.1", "greater than 0"),
    ),
    Bad(
        "precision a number", HEAD + "space: {precision: 16}\n", ("space.precision: got 16", "fp32")
    ),
    Bad(
        "num_workers NaN",
        HEAD + "space: {num_workers: .nan}\n",
        ("space.num_workers: got nan", "whole number"),
    ),
    Bad(
        "prefetch_factor zero",
        HEAD + "space: {prefetch_factor: 0}\n",
        ("space.prefetch_factor: got 0", "at least 1"),
    ),
    Bad(
        "schedule_epochs a word",
        HEAD + "space: {schedule_epochs: all}\n",
        ("space.schedule_epochs: got 'all'",),
    ),
    Bad("preset a number", HEAD + "space: {preset: 5}\n", ("space.preset: got 5", "preset")),
    Bad(
        "preset file with an unknown knob",
        HEAD + "space: {preset: my.yaml}\n",
        ("lrr", "unknown key"),
        files=(("my.yaml", PRESET + "lrr: 0.1\n"),),
        named="my.yaml",
    ),
    Bad(
        "preset file empty",
        HEAD + "space: {preset: my.yaml}\n",
        ("(top level)",),
        files=(("my.yaml", ""),),
        named="my.yaml",
    ),
    Bad(
        "a parameter's range left empty",
        HEAD + "space: {params: {width: {}}}\n",
        ("space.params.width.low",),
    ),
    Bad(
        "a parameter's range of booleans",
        HEAD + "space: {params: {flag: {low: false, high: true}}}\n",
        ("space.params.flag.low: got False",),
    ),
    # baseline
    Bad("baseline lr a word", HEAD + "baseline: {lr: fast}\n", ("baseline.lr: got 'fast'",)),
    Bad(
        "baseline prefetch_factor zero",
        HEAD + "baseline: {num_workers: 1, prefetch_factor: 0}\n",
        ("baseline.prefetch_factor: got 0", "at least 1"),
    ),
    Bad(
        "baseline of a thousand workers",
        HEAD + "baseline: {num_workers: 1000}\n",
        ("baseline.num_workers: got 1000", "core"),
    ),
    Bad(
        "baseline batch larger than the training set",
        HEAD + "baseline: {batch_size: 4096}\n",
        ("baseline.batch_size: got 4096", "training samples"),
    ),
    # storage and device, as written in the file
    Bad(
        "storage a list",
        HEAD + "storage: [sqlite:///a.db]\n",
        ("storage: got ['sqlite:///a.db']", "sqlite:///"),
    ),
    Bad(
        "storage is the study file",
        HEAD + "storage: sqlite:///study.yaml\n",
        ("storage", "study file"),
    ),
    Bad(
        "storage with two slashes",
        HEAD + "storage: sqlite://study.db\n",
        ("storage", "sqlite://study.db"),
    ),
]


@pytest.mark.parametrize("case", FILE_CASES, ids=[case.id for case in FILE_CASES])
def test_a_bad_study_file_is_one_line_and_leaves_every_file_alone(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,
    case: Bad,
) -> None:
    """Exit 2, one line naming study.yaml and the key; the study stored before is byte for byte as
    it was."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_bytes(case.text if isinstance(case.text, bytes) else case.text.encode())
    for name, text in case.files:
        (tmp_path / name).write_text(text)
    (tmp_path / "study.db").write_bytes(stored.db)
    before = snapshot(tmp_path)

    result = cli(capsys, "run", "study.yaml")

    assert_refused(result, case.named, *case.fragments)
    assert_unchanged(before, tmp_path)


def test_the_cuda_device_a_machine_lacks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """device: cuda:99 names a GPU this machine does not have: refused before any storage exists."""
    import torch

    if torch.cuda.device_count() > 99:
        pytest.skip("this machine has a cuda:99")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(HEAD + "device: 'cuda:99'\n")
    assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", "device", "cuda:99")
    assert not (tmp_path / "study.db").exists()


def test_an_alias_bomb_is_refused_in_a_line_a_person_can_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six lines of YAML aliases stand for a million strings; the error quotes the value it got,
    which must not become megabytes on one line (nor take long)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(HEAD + f"name: {_bomb()}\n")
    started = time.monotonic()
    line = assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", "name")
    assert time.monotonic() - started < 30
    assert len(line) < 10_000, f"the error line is {len(line):,} characters long: {line[:300]}..."


def test_a_byte_order_mark_is_no_part_of_the_first_key(tmp_path: Path) -> None:
    """Editors on Windows start UTF-8 files with a BOM: the file reads as without it."""
    from autotune.spec.study_file import load

    path = tmp_path / "study.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + HEAD.encode())
    assert load(path).task == "tests.tasks:blobs"


# ---------------------------------------------------------------------------------------------
# 2. The study file's path, and the storage


def test_a_study_file_in_a_symlink_loop_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    os.symlink("loop.yaml", tmp_path / "study.yaml")
    os.symlink("study.yaml", tmp_path / "loop.yaml")
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", "(file)")
    assert_unchanged(before, tmp_path)


def test_an_unreadable_study_file_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "study.yaml"
    path.write_text(HEAD)
    path.chmod(0)
    try:
        assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", "(file)", "cannot be read")
    finally:
        path.chmod(0o644)
    assert not (tmp_path / "study.db").exists()


@dataclasses.dataclass(frozen=True)
class BadStorage:
    id: str
    url: str
    fragments: tuple[str, ...]
    setup: Callable[[Path, Stored], None] = lambda folder, stored: None
    command: str = "run"


def _link_to_study_file(folder: Path, stored: Stored) -> None:
    os.symlink("study.yaml", folder / "alias.db")


def _symlink_loop_folder(folder: Path, stored: Stored) -> None:
    os.symlink("loop", folder / "loop")


def _garbage_journal(folder: Path, stored: Stored) -> None:
    (folder / "study.journal").write_bytes(GARBAGE)


def _sqlite_as_journal(folder: Path, stored: Stored) -> None:
    (folder / "study.journal").write_bytes(stored.db)


def _journal_as_sqlite(folder: Path, stored: Stored) -> None:
    (folder / "j.db").write_bytes(stored.journal)


def _other_study(folder: Path, stored: Stored) -> None:
    import optuna

    optuna.create_study(study_name="other", storage=f"sqlite:///{folder / 'other.db'}")


STORAGE_CASES = [
    BadStorage("sqlite:// with no path", "sqlite://", ("storage", "sqlite://")),
    BadStorage("sqlite:/// with an empty path", "sqlite:///", ("storage",)),
    BadStorage("journal:/// with an empty path", "journal:///", ("storage",)),
    BadStorage(
        "journal:// with two slashes",
        "journal://relative.journal",
        ("storage", "journal://relative.journal"),
    ),
    BadStorage("sqlite in memory", "sqlite:///:memory:", ("storage", ":memory:")),
    BadStorage("/dev/null as the database", "sqlite:////dev/null", ("storage", "/dev/null")),
    BadStorage("an empty --storage", "", ("storage: got ''", "sqlite:///")),
    BadStorage(
        "a symbolic link to the study file",
        "sqlite:///alias.db",
        ("storage", "study file"),
        setup=_link_to_study_file,
    ),
    BadStorage(
        "a folder in a symlink loop",
        "sqlite:///loop/study.db",
        ("storage", "loop"),
        setup=_symlink_loop_folder,
    ),
    BadStorage(
        "a journal file of garbage",
        "journal:///study.journal",
        ("storage", "study.journal"),
        setup=_garbage_journal,
    ),
    BadStorage(
        "an SQLite file given as the journal",
        "journal:///study.journal",
        ("storage", "study.journal"),
        setup=_sqlite_as_journal,
    ),
    BadStorage(
        "a journal file given as SQLite",
        "sqlite:///j.db",
        ("storage", "j.db"),
        setup=_journal_as_sqlite,
    ),
    BadStorage(
        "a database server nobody routes to",
        "postgresql://autotune@10.255.255.1:5432/study",
        ("storage", "10.255.255.1"),
    ),
    BadStorage(
        "a database server of no such host",
        "postgresql://autotune@nosuchhost.invalid/study",
        ("storage", "nosuchhost.invalid"),
    ),
    BadStorage(
        "mysql without its driver", "mysql://autotune@127.0.0.1/study", ("storage", "mysql://")
    ),
    BadStorage(
        "report on a storage with another study",
        "sqlite:///other.db",
        ("no study named 'study'",),
        setup=_other_study,
        command="report",
    ),
    BadStorage(
        "report on a journal file of garbage",
        "journal:///study.journal",
        ("storage", "study.journal"),
        setup=_garbage_journal,
        command="report",
    ),
]


@pytest.mark.parametrize("case", STORAGE_CASES, ids=[case.id for case in STORAGE_CASES])
def test_a_storage_that_cannot_be_used_is_one_line_and_fast(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,
    tag: str,
    case: BadStorage,
) -> None:
    """Refused before any training, in one line; never told to run the very command it ran; every
    file there (a study stored before among them) unchanged; within seconds, not a network
    timeout."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(HEAD + QUIET_SPACE + TINY)
    (tmp_path / "study.db").write_bytes(stored.db)
    case.setup(tmp_path, stored)
    before = snapshot(tmp_path)
    started = time.monotonic()

    result = cli(capsys, case.command, "study.yaml", "--storage", case.url)

    assert time.monotonic() - started < 20
    line = assert_refused(result, "study.yaml", *case.fragments)
    if case.command == "run":
        assert "run `autotune run" not in line, (
            f"tells the user to run the command that just failed: {line}"
        )
    assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# 3. Options


OPTION_CASES = [
    ("trials in exponent form", ["run", "study.yaml", "--trials", "1e3"], ("--trials", "'1e3'")),
    ("timeout nan", ["run", "study.yaml", "--timeout", "nan"], ("--timeout", "'nan'")),
    ("timeout inf", ["run", "study.yaml", "--timeout", "inf"], ("--timeout", "'inf'")),
    ("workers zero", ["run", "study.yaml", "--workers", "0"], ("--workers", "'0'")),
    ("workers negative", ["run", "study.yaml", "--workers", "-2"], ("--workers", "'-2'")),
    ("workers fractional", ["run", "study.yaml", "--workers", "1.5"], ("--workers", "'1.5'")),
    (
        "isolation unknown",
        ["run", "study.yaml", "--isolation", "thread"],
        ("--isolation", "'thread'"),
    ),
    (
        "dashboard port 70000",
        ["dashboard", "study.yaml", "--port", "70000"],
        ("--port", "'70000'", "65535"),
    ),
    ("dashboard port zero", ["dashboard", "study.yaml", "--port", "0"], ("--port", "'0'")),
    ("dashboard port a word", ["dashboard", "study.yaml", "--port", "http"], ("--port", "'http'")),
    (
        "a misspelt flag",
        ["run", "study.yaml", "--trails", "3"],
        ("unrecognized arguments", "--trails"),
    ),
    (
        "report --format",
        ["report", "study.yaml", "--format", "csv"],
        ("unrecognized arguments", "--format"),
    ),
    ("export format unknown", ["export", "study.yaml", "--format", "xml"], ("--format", "'xml'")),
    ("export without a format", ["export", "study.yaml"], ("--format",)),
    ("no command", [], ("COMMAND",)),
    ("unknown command", ["tune", "study.yaml"], ("'tune'",)),
    (
        "two study files",
        ["run", "study.yaml", "other.yaml"],
        ("unrecognized arguments", "other.yaml"),
    ),
    ("quiet given a value", ["run", "study.yaml", "--quiet=yes"], ("--quiet",)),
    (
        "storage without its value",
        ["run", "study.yaml", "--storage"],
        ("--storage", "expected one argument"),
    ),
]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [case[1:] for case in OPTION_CASES],
    ids=[case[0] for case in OPTION_CASES],
)
def test_a_mistaken_option_is_argparse_usage_and_touches_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,
    args: list[str],
    fragments: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    place(tmp_path, stored)
    before = snapshot(tmp_path)
    assert_usage_error(cli(capsys, *args), *fragments)
    assert_unchanged(before, tmp_path)


# ---------------------------------------------------------------------------------------------
# 4. Where report and export write


def _hard_link(name: str, to: str) -> Callable[[Path], None]:
    return lambda folder: os.link(folder / to, folder / name)


def _symlink(name: str, to: str) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(to, folder / name)

    return make


def _folder(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).mkdir()


def _foreign(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_text("my own notes, not autotune's\n")


OUTPUT_CASES = [
    (
        "html over the study file",
        ["report", "study.yaml", "--html", "study.yaml", "--force"],
        ("--html", "study file"),
        None,
    ),
    (
        "csv over the storage",
        ["report", "study.yaml", "--csv", "study.db", "--force"],
        ("--csv", "storage"),
        None,
    ),
    (
        "export over the storage",
        ["export", "study.yaml", "--format", "json", "-o", "study.db", "--force"],
        ("-o", "storage"),
        None,
    ),
    (
        "export over a hard link to the storage",
        ["export", "study.yaml", "--format", "yaml", "-o", "hard.db", "--force"],
        ("-o", "storage"),
        _hard_link("hard.db", "study.db"),
    ),
    (
        "html over a symbolic link to the study file",
        ["report", "study.yaml", "--html", "link.html", "--force"],
        ("--html", "study file"),
        _symlink("link.html", "study.yaml"),
    ),
    (
        "export through a relative link in a folder",
        ["export", "study.yaml", "--format", "json", "-o", "sub/w.json", "--force"],
        ("-o", "storage"),
        _symlink("sub/w.json", "../study.db"),
    ),
    (
        "export over SQLite's rollback journal",
        ["export", "study.yaml", "--format", "json", "-o", "study.db-journal", "--force"],
        ("-o", "journal"),
        None,
    ),
    (
        "csv over the runner lock",
        ["report", "study.yaml", "--csv", "study.db.runner.lock", "--force"],
        ("--csv", "lock"),
        None,
    ),
    (
        "csv into a folder",
        ["report", "study.yaml", "--csv", "out"],
        ("--csv", "out"),
        _folder("out"),
    ),
    (
        "export into a missing folder",
        ["export", "study.yaml", "--format", "torch", "-o", "no/such/winner.py"],
        ("-o", "no/such/winner.py"),
        None,
    ),
    (
        "html under the study file as if a folder",
        ["report", "study.yaml", "--html", "study.yaml/report.html"],
        ("--html", "study.yaml/report.html"),
        None,
    ),
    (
        "html over a file autotune did not write",
        ["report", "study.yaml", "--html", "notes.html"],
        ("--html", "notes.html", "--force"),
        _foreign("notes.html"),
    ),
    (
        "csv into a folder in a symlink loop",
        ["report", "study.yaml", "--csv", "loop/trials.csv"],
        ("--csv", "loop/trials.csv"),
        _symlink("loop", "loop"),
    ),
    (
        "csv onto a full disk",
        ["report", "study.yaml", "--csv", "/dev/full"],
        ("--csv", "/dev/full"),
        None,
    ),
    (
        "export onto a full disk",
        ["export", "study.yaml", "--format", "hf", "-o", "/dev/full", "--force"],
        ("-o", "/dev/full"),
        None,
    ),
    (
        "html onto a full disk, with json",
        ["report", "study.yaml", "--json", "--html", "/dev/full"],
        ("--html", "/dev/full"),
        None,
    ),
]


@pytest.mark.parametrize(
    ("args", "fragments", "setup"),
    [case[1:] for case in OUTPUT_CASES],
    ids=[case[0] for case in OUTPUT_CASES],
)
def test_an_output_that_must_not_or_cannot_be_written_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,
    args: list[str],
    fragments: tuple[str, ...],
    setup: Callable[[Path], None] | None,
) -> None:
    """Refused (or failed) in one line with exit 2, nothing printed on stdout, no file written,
    half-written or replaced, by any name, link or --force."""
    if "/dev/full" in args and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    monkeypatch.chdir(tmp_path)
    place(tmp_path, stored)
    if setup is not None:
        setup(tmp_path)
    before = snapshot(tmp_path)
    assert_refused(cli(capsys, *args), *fragments)
    assert_unchanged(before, tmp_path)


@contextlib.contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `folder`; skips where mounting is not allowed."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small disk here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> None:
    """Write into `folder` until its disk is full."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb", buffering=0) as filler:
        while True:
            filler.write(b"\0" * 4096)


def test_a_report_onto_a_full_disk_leaves_the_old_one_whole(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stored: Stored,
) -> None:
    """--html onto a disk that fills up mid-write: one line, exit 2, the earlier report intact and
    no temporary file left beside it."""
    monkeypatch.chdir(tmp_path)
    place(tmp_path, stored)
    with small_disk(tmp_path / "disk", "16m") as disk:
        assert cli(capsys, "report", "study.yaml", "--html", "disk/report.html").code == 0
        old = (disk / "report.html").read_bytes()
        (disk / "report.html").write_bytes(old[: 8 * 1024])  # an earlier, shorter report of ours
        old = (disk / "report.html").read_bytes()
        fill(disk)
        assert_refused(
            cli(capsys, "report", "study.yaml", "--html", "disk/report.html", "--force"),
            "--html",
            "disk/report.html",
        )
        assert (disk / "report.html").read_bytes() == old
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "report.html"]


def test_a_storage_on_a_full_disk_is_one_line_and_keeps_every_finished_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    """The reference's full disk: one line naming the storage and "no space left on the device",
    exit 2; the trials finished before are intact and, with space freed, the same command
    finishes the budget."""
    monkeypatch.chdir(tmp_path)
    with small_disk(tmp_path / "disk", "2m") as disk:
        (disk / "study.yaml").write_text(EASY)
        assert cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "1").code == 0
        fill(disk)
        line = assert_refused(
            cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "3"),
            "disk/study.yaml",
            "no space left on the device",
        )
        assert "study.db" in line
        (disk / "filler").unlink()
        assert finished([t for t in trials_of(disk) if t.state.name != "RUNNING"]) >= 1
        assert not [t for t in trials_of(disk) if t.state.name == "RUNNING"]
        again = cli(capsys, "run", "disk/study.yaml", "--quiet", "--trials", "3")
        assert again.code == 0, again.err
        assert finished(trials_of(disk)) == 3


# ---------------------------------------------------------------------------------------------
# 5. Signals, kills and a second run at once, on a real process


def spawn(folder: Path, tag: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """`python -m autotune ARGS` in `folder`, in a session of its own, tagged."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), TAG: tag, **env}
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=folder,
        env=environ,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@contextlib.contextmanager
def ended_on_exit(*runs: subprocess.Popen[Any]) -> Iterator[None]:
    """Runs a case started together: whatever it raises, none outlives it (each run's session is
    killed)."""
    try:
        yield
    finally:
        for run in runs:
            if run.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.pid, signal.SIGKILL)
            run.communicate()


@contextlib.contextmanager
def saying(which: str) -> Iterator[None]:
    """An assertion about one of several runs names the run."""
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"{which}: {error}") from None


def as_they_start(
    runs: dict[Any, tuple[Path | Callable[[], bool], subprocess.Popen[str]]], *, within: float = 90
) -> Iterator[Any]:
    """Each run's key as soon as its file appears (or its check holds), the runs watched together:
    a case that acts on one (a signal) acts at once, never after waiting on another."""
    pending = dict(runs)
    deadline = time.monotonic() + within
    while pending:
        for key, (ready, process) in list(pending.items()):
            if ready() if callable(ready) else ready.exists():
                del pending[key]
                yield key
            elif process.poll() is not None:
                out, err = process.communicate()
                pytest.fail(
                    f"{key}: autotune exited {process.returncode} before it was ready:\n"
                    f"{err[-3000:]}"
                )
        assert time.monotonic() < deadline, f"never ready: {list(pending)}"
        time.sleep(0.005)


SLOW = (
    "task: tests.hostile.tasks:slow\ntarget: {metric: accuracy, value: 0.99}\n"
    + QUIET_SPACE
    + "probe: none\nbudget: {trials: 3, max_epochs: 1}\nconfirm: {top: 0}\n"
)

# A run held at a known point for as long as a case needs it alive, whatever the machine's load
# (rather than a budget of many trials that a busy machine might still outrun): the slow task,
# whose every trial waits at its first training step (once it has touched $STARTED's file) for a
# `ticket-*` file to take in the folder $GATE names, or for an `open` file there. Without $GATE
# it is the slow task. Its module is written beside the study (`place_held`).
GATE = "AUTOTUNE_HOSTILE_GATE"
HELD_MODULE = f'''\
import os
import time
from pathlib import Path

from tests.hostile import tasks


class Held(tasks._Slow):
    waited = False

    def forward(self, x):
        out = super().forward(x)
        gate = os.environ.get("{GATE}")
        if self.training and gate and not self.waited:
            self.waited = True
            while not Path(gate, "open").exists():
                for ticket in sorted(Path(gate).glob("ticket-*")):
                    try:
                        ticket.unlink()
                        return out
                    except FileNotFoundError:
                        continue
                time.sleep(0.01)
        return out


def slow():
    return tasks.Task(model=Held, train=tasks._blobs(1024, 0), val=tasks._blobs(256, 1))
'''
# Where the run is stopped in trial 0 and the same command then runs to the budget: two trials
# show the interrupted one run again and the study go on past it.
SLOW_TWO = SLOW.replace("trials: 3", "trials: 2")
HELD = SLOW.replace("tests.hostile.tasks:slow", "hostile_held:slow")


def place_held(folder: Path, *, tickets: int = 0) -> Path:
    """hostile_held.py beside the study and its gate folder (`tickets` trials let through)."""
    (folder / "hostile_held.py").write_text(HELD_MODULE)
    gate = folder / "gate"
    gate.mkdir()
    gate.chmod(0o777)  # a run as another user takes its tickets too
    for number in range(tickets):
        (gate / f"ticket-{number}").touch()
    return gate


def assert_resumes_to_the_budget(
    folder: Path, capsys: pytest.CaptureFixture[str], *options: str, budget: int, why: str
) -> None:
    """The interrupted trial is marked (FAIL, reason `interrupted: ...`), none is left RUNNING, and
    the same command run again at once ends with exactly the budget finished."""
    trials = trials_of(folder)
    assert not [t.number for t in trials if t.state.name == "RUNNING"]
    assert any(r.startswith("interrupted:") and why in r for r in reasons(trials)), reasons(trials)
    again = cli(capsys, "run", "study.yaml", "--quiet", *options)
    assert again.code == 0 and "Traceback" not in again.err, again.err
    trials = trials_of(folder)
    assert finished(trials) == budget and not [
        t for t in trials if t.state.name in ("RUNNING", "WAITING")
    ]


# Each stops a study of its own in trial 0: what its study file adds to SLOW_TWO.
STOPPED_IN_A_TRIAL = {
    "SIGINT": "",
    "SIGTERM": "",
    # Ctrl-C pressed twice reaches every process of the group (the fork server, the trial's child)
    "Ctrl-C twice to the group": "isolation: process\n",
    "SIGKILL to the group": "",
}


def test_a_signal_or_a_kill_during_a_trial_exits_as_documented_and_the_rerun_ends_at_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    """SIGINT, SIGTERM: their status, no traceback, `Resume with:` last. Ctrl-C twice to the whole
    group with child processes: one clean stop, exit 130. A kill: the trial left RUNNING. Then no
    process is left, and the same command run again ends at exactly the budget. The four studies
    run at once, each stopped the moment its trial trains (the runs watched together)."""
    runs = {}
    for case, extra in STOPPED_IN_A_TRIAL.items():
        folder = tmp_path / case.replace(" ", "-")
        folder.mkdir()
        (folder / "study.yaml").write_text(SLOW_TWO + extra)
        marker = folder / "started"
        runs[case] = (marker, spawn(folder, tag, "run", "study.yaml", **{STARTED: str(marker)}))
    with ended_on_exit(*(run for _, run in runs.values())):
        for case in as_they_start(runs):
            run = runs[case][1]
            if case == "Ctrl-C twice to the group":
                os.killpg(run.pid, signal.SIGINT)
                time.sleep(0.05)
                os.killpg(run.pid, signal.SIGINT)
            elif case == "SIGKILL to the group":
                os.killpg(run.pid, signal.SIGKILL)
            else:
                run.send_signal(signal.Signals[case])
        ended = {case: run.communicate(timeout=90)[1] for case, (_, run) in runs.items()}
    assert_nothing_left(tag)
    for case, err in ended.items():
        run, folder = runs[case][1], runs[case][0].parent
        with saying(case), contextlib.chdir(folder):
            if case in ("SIGINT", "SIGTERM"):
                signum = signal.Signals[case]
                assert run.returncode == 128 + signum, err
                assert "Traceback" not in err, err
                assert err.strip().splitlines()[-1] == "Resume with: autotune run study.yaml", err
                assert_resumes_to_the_budget(folder, capsys, budget=2, why=case)
            elif case == "Ctrl-C twice to the group":
                # The second press lands while the process exits and ends it by SIGINT itself:
                # 130 to a shell all the same.
                assert run.returncode in (130, -signal.SIGINT), err
                assert "Traceback" not in err, err
                # In this process, not in children: a fork server started here would outlive the
                # test (isolation may change freely).
                assert_resumes_to_the_budget(
                    folder, capsys, "--isolation", "none", budget=2, why="SIGINT"
                )
            else:
                states = [t.state.name for t in trials_of(folder)]
                assert states.count("RUNNING") == 1, states  # as the kill left it
                again = cli(capsys, "run", "study.yaml", "--quiet")
                assert again.code == 0 and "Traceback" not in again.err, again.err
                trials = trials_of(folder)
                assert finished(trials) == 2 and not [
                    t for t in trials if t.state.name in ("RUNNING", "WAITING")
                ]
                assert any("the process stopped during this trial" in r for r in reasons(trials)), (
                    reasons(trials)
                )


def test_a_signal_during_the_confirmation_exits_130_and_the_rerun_confirms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    """Ctrl-C while the fastest trial is re-measured on fresh seeds: exit 130, the trials kept; the
    same command then confirms without training a trial more."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(
        SLOW.replace("value: 0.99", "value: 0.5")
        .replace("trials: 3", "trials: 1")
        .replace("confirm: {top: 0}", "confirm: {top: 1, runs: 2}")
    )
    marker = tmp_path / "started"
    run = spawn(tmp_path, tag, "run", "study.yaml", **{STARTED: str(marker)})
    deadline = time.monotonic() + 90
    while not (tmp_path / "started.confirm").exists():
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert_nothing_left(tag)
    assert finished(trials_of(tmp_path)) == 1
    again = cli(capsys, "run", "study.yaml", "--quiet")
    assert again.code == 0 and "Traceback" not in again.err, again.err
    assert "confirmed" in again.out and finished(trials_of(tmp_path)) == 1


def _imports_torch(pid: int) -> Callable[[], bool]:
    return lambda: b"libtorch" in Path(f"/proc/{pid}/maps").read_bytes()


def test_a_signal_while_torch_imports_is_one_line(tmp_path: Path, tag: str) -> None:
    """Before a run begins: `autotune: interrupted (SIGINT)` alone (reference, exit statuses);
    SIGTERM ends it as SIGTERM does (143 to the shell); no traceback, no storage. A process for
    each, started at once, each signalled the moment torch's import has begun in it."""
    runs = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        folder = tmp_path / signum.name
        folder.mkdir()
        (folder / "study.yaml").write_text(SLOW)
        run = spawn(folder, tag, "run", "study.yaml")
        runs[signum] = (_imports_torch(run.pid), run)
    with ended_on_exit(*(run for _, run in runs.values())):
        for signum in as_they_start(runs, within=60):
            runs[signum][1].send_signal(signum)
        for signum, (_, run) in runs.items():
            out, err = run.communicate(timeout=60)
            with saying(signum.name):
                assert "Traceback" not in err, err
                assert out == ""
                if signum == signal.SIGINT:
                    assert run.returncode == 130
                    assert [line for line in err.splitlines() if line.strip()] == [
                        "autotune: interrupted (SIGINT)"
                    ], err
                else:
                    assert run.returncode in (143, -signal.SIGTERM) and err.strip() in (
                        "",
                        "autotune: interrupted (SIGTERM)",
                    ), err
                assert not (tmp_path / signum.name / "study.db").exists()
    assert_nothing_left(tag)


# A second run of a running study is refused, naming the first's pid, and the first ends at its
# budget: checked beside the running study's other names, on the same held run, in
# tests/test_hostile_round_four.py (test_a_second_run_on_the_same_storage_under_another_name...).


# ---------------------------------------------------------------------------------------------
# 6. Broken tasks


def run_task(
    folder: Path,
    capsys: pytest.CaptureFixture[str],
    task: str,
    *,
    space: str = QUIET_SPACE,
    extra: str = "",
) -> Result:
    (folder / "study.yaml").write_text(
        f"task: {json.dumps(task)}\ntarget: {{metric: accuracy, value: 0.5}}\n"
        + space
        + TINY
        + extra
    )
    return cli(capsys, "run", "study.yaml", "--quiet")


# Reference, "Your own task": a task that cannot be imported or built is an error naming the key,
# before the first trial; so are a training set smaller than a batch, and datasets autotune cannot
# count or index (it checks their sizes before the first trial).
TASK_REFUSED = [
    (
        "factory returns None",
        "tests.hostile.tasks:returns_none",
        ("task", "NoneType", "autotune.Task"),
    ),
    (
        "factory returns a dict",
        "tests.hostile.tasks:returns_a_dict",
        ("task", "dict", "autotune.Task"),
    ),
    ("task is not callable", "tests.hostile.tasks:NOT_CALLABLE", ("task", "not callable")),
    ("factory needs an argument", "tests.hostile.tasks:needs_an_argument", ("task", "data_folder")),
    ("attribute missing", "tests.hostile.tasks:nosuchtask", ("task", "nosuchtask")),
    ("no callable after the colon", "tests.hostile.tasks:", ("task", "tests.hostile.tasks:")),
    (
        "an empty training set",
        "tests.hostile.tasks:empty_training_set",
        ("batch_size", "0 training samples"),
    ),
    ("an iterable training set", "tests.hostile.tasks:iterable_training_set", ("task",)),
    ("no validation set", "tests.hostile.tasks:no_validation_set", ("task",)),
]


@pytest.mark.parametrize(
    ("task", "fragments"),
    [case[1:] for case in TASK_REFUSED],
    ids=[case[0] for case in TASK_REFUSED],
)
def test_a_task_that_cannot_be_trained_at_all_is_refused_before_any_trial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    task: str,
    fragments: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert_refused(run_task(tmp_path, capsys, task), "study.yaml", *fragments)
    assert not (tmp_path / "study.db").exists()


@pytest.mark.parametrize(
    "body, fragments",
    [
        ("def task(:\n    pass\n", ("SyntaxError",)),
        ("import sys\nsys.exit(3)\n", ("task",)),
        ("def task():\n    raise SystemExit('no GPU, no task')\n", ("task", "no GPU, no task")),
    ],
    ids=["a syntax error", "sys.exit at import", "SystemExit from the factory"],
)
def test_a_task_module_that_breaks_while_loading_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    body: str,
    fragments: tuple[str, ...],
) -> None:
    """Whatever a task's module does while it is imported or built (sys.exit included) is its
    error, named in one line with exit 2: never the exit status of the user's module, nor a
    traceback."""
    monkeypatch.chdir(tmp_path)
    module = f"hostile_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(body)
    assert_refused(run_task(tmp_path, capsys, f"{module}:task"), "study.yaml", *fragments)
    assert not (tmp_path / "study.db").exists()


# Reference, "When things go wrong": an error in a trial FAILS that trial with its type and first
# line, and the study goes on; when every trial failed, the report, then one last line giving how
# many and the most common reason; exit status 1. A loss or metric gone NaN is a divergence: PRUNED.
WORKER = QUIET_SPACE.replace("num_workers: 0", "num_workers: 1")
# the default space, as a user leaves it (channels_last searched among the rest), but one
# accumulation step: the task's 256 samples would not hold the largest batches x 4 (trials PRUNED
# unrun for that, not failed)
DEFAULT_SPACE = "space: {num_workers: 0, accumulation_steps: 1}\n"
TASK_FAILS = [
    (
        "the model factory raises",
        "tests.hostile.tasks:model_raises",
        "FileNotFoundError: weights.pt is missing",
        QUIET_SPACE,
    ),
    (
        "a model with no parameters",
        "tests.hostile.tasks:no_parameters",
        "empty parameter list",
        QUIET_SPACE,
    ),
    (
        "every item raises, in a loader worker",
        "tests.hostile.tasks:every_item_raises",
        "KeyError",
        WORKER,
    ),
    (
        "inputs of the wrong shape",
        "tests.hostile.tasks:wrong_input_shape",
        "shapes cannot be multiplied",
        QUIET_SPACE,
    ),
    (
        "labels out of range",
        "tests.hostile.tasks:labels_out_of_range",
        "out of bounds",
        QUIET_SPACE,
    ),
    (
        "a loss that is not a scalar",
        "tests.hostile.tasks:loss_not_scalar",
        "scalar outputs",
        QUIET_SPACE,
    ),
    (
        "an optimizer factory returning None",
        "tests.hostile.tasks:optimizer_returns_none",
        "Optimizer",
        QUIET_SPACE,
    ),
    (
        "a metric that returns text",
        "tests.hostile.tasks:metric_returns_text",
        "'high'",
        QUIET_SPACE,
    ),
    (
        "a model factory returning a function",
        "tests.hostile.tasks:model_is_a_function",
        "'function' object",
        DEFAULT_SPACE,
    ),
]


@pytest.mark.parametrize(
    ("task", "why", "space"),
    [case[1:] for case in TASK_FAILS],
    ids=[case[0] for case in TASK_FAILS],
)
def test_a_task_whose_every_trial_fails_says_why_with_status_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    task: str,
    why: str,
    space: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_task(tmp_path, capsys, task, space=space)
    assert "Traceback" not in result.err + result.out, result.err
    assert result.code == 1, result.err
    assert result.out.startswith("Study study: 2 trials"), result.out[:500]
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("autotune: every one of the 2 trials failed") and why in last, last
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"] and all(
        why in r for r in reasons(trials)
    )


def test_a_model_that_outputs_nan_is_pruned_as_diverged_and_the_study_ends_with_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_task(tmp_path, capsys, "tests.hostile.tasks:outputs_nan")
    assert result.code == 0 and "Traceback" not in result.err, result.err
    assert "No trial reached the target yet." in result.out
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"]
    assert all(
        t.user_attrs.get("diverged") and "diverged" in t.user_attrs["reason"] for t in trials
    )


def test_a_task_that_prints_megabytes_in_child_processes_neither_hangs_nor_fails(
    tmp_path: Path, tag: str
) -> None:
    """2 MiB on stdout each time a model is built, in a child process per trial: the study ends."""
    (tmp_path / "study.yaml").write_text(
        "task: tests.hostile.tasks:prints_megabytes\ntarget: {metric: accuracy, value: 0.5}\n"
        + QUIET_SPACE
        + TINY
        + "isolation: process\n"
    )
    run = spawn(tmp_path, tag, "run", "study.yaml", "--quiet")
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0 and "Traceback" not in err, err[-3000:]
    # both trials ran to an end (reaching the target, or stopped once they could no longer win)
    assert "Study study: 2 trials: " in out and ", 0 failed, 0 interrupted" in out, out[:500]
    assert_nothing_left(tag)


# ---------------------------------------------------------------------------------------------
# 7. Training commands


def command_study(command: str, env: str = "") -> str:
    return (
        "target: {metric: accuracy, value: 0.5}\n"
        f"task: {{command: {json.dumps(command)}{env}}}\n" + TINY
    )


COMMAND_REFUSED = [
    (
        "a program not on the PATH",
        "nosuchtrainer --lr {lr}",
        "",
        ("task.command", "nosuchtrainer", "not an executable"),
    ),
    (
        "a script without its execute bit",
        "./train.sh --lr {lr}",
        "",
        ("task.command", "train.sh", "not an executable"),
    ),
    ("a folder as the program", "./ --lr {lr}", "", ("task.command", "not an executable")),
    (
        "a placeholder without its brace",
        "python train.py --lr {lr",
        "",
        ("task.command", "malformed placeholder"),
    ),
    (
        "a placeholder with a conversion",
        "python train.py --lr {lr!r}",
        "",
        ("task.command", "malformed placeholder"),
    ),
    (
        "a placeholder typo in env",
        "python train.py",
        ", env: {S: '{sed}'}",
        ("task.env.S", "{sed}", "did you mean {seed}?"),
    ),
    (
        "an env value that is true",
        "python train.py",
        ", env: {S: true}",
        ("task.env.S: got True", "a string or a number"),
    ),
    ("an env value that is null", "python train.py", ", env: {S: null}", ("task.env.S: got None",)),
    ("an env name that is a number", "python train.py", ", env: {1: x}", ("task.env", "1")),
    ("an env name with '='", "python train.py", ", env: {'A=B': x}", ("task.env", "A=B")),
    ("an env value with a NUL", "python train.py", ', env: {S: "a\\0b"}', ("task.env.S",)),
]


@pytest.mark.parametrize(
    ("command", "env", "fragments"),
    [case[1:] for case in COMMAND_REFUSED],
    ids=[case[0] for case in COMMAND_REFUSED],
)
def test_a_command_that_cannot_run_is_refused_before_any_trial(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    command: str,
    env: str,
    fragments: tuple[str, ...],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/sh\nexit 0\n")  # mode 0644: not executable
    (tmp_path / "study.yaml").write_text(command_study(command, env))
    line = assert_refused(cli(capsys, "run", "study.yaml"), "study.yaml", *fragments)
    if "1: x" in env:
        assert "got 'x'" not in line, (
            f"blames the value 'x' (a string) for a name that is not one: {line}"
        )
    assert not (tmp_path / "study.db").exists()


COMMAND_FAILS = [
    ("exits at once", "true", "no metric"),
    ("exits 1 at once", "false", "crashed: the command exited with status 1"),
    ("binary garbage on the report descriptor", f"python {SPEAKS} garbage", "not JSON objects"),
    ("a metric as a string", f"python {SPEAKS} metric_text", "no metric"),
    ("a metric as true", f"python {SPEAKS} metric_bool", "no metric"),
    ("a 4 MiB report line without an end", f"python {SPEAKS} huge_line", "no metric"),
]


@pytest.mark.parametrize(
    ("command", "why"),
    [case[1:] for case in COMMAND_FAILS],
    ids=[case[0] for case in COMMAND_FAILS],
)
def test_a_command_that_reports_nothing_usable_fails_its_trials_with_status_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    command: str,
    why: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(command_study(command) + QUIET_SPACE)
    result = cli(capsys, "run", "study.yaml", "--quiet")
    assert "Traceback" not in result.err + result.out, result.err
    assert result.code == 1, result.err
    last = result.err.strip().splitlines()[-1]
    assert last.startswith("autotune: every one of the 2 trials failed") and why in last, last
    assert all(why in r for r in reasons(trials_of(tmp_path)))


def test_a_command_reporting_nan_is_pruned_as_diverged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(command_study(f"python {SPEAKS} nan") + QUIET_SPACE)
    result = cli(capsys, "run", "study.yaml", "--quiet")
    assert result.code == 0 and "Traceback" not in result.err, result.err
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials] == ["PRUNED", "PRUNED"] and all(
        t.user_attrs.get("diverged") for t in trials
    )


# ---------------------------------------------------------------------------------------------
# 8. Budgets and targets at their edges: accepted values, run to the end without a traceback


BUDGET_EDGES = [
    ("target exactly 1", "target: {metric: accuracy, value: 1}\n", "", 0),
    ("max_epochs of a billionth", TARGET, "budget: {trials: 2, max_epochs: 1e-9}\n", 0),
    (
        "max_seconds of a billionth",
        TARGET,
        "budget: {trials: 2, max_epochs: 1, max_seconds: 1e-9}\n",
        0,
    ),
    (
        "eval_every past max_epochs",
        TARGET,
        "budget: {trials: 2, max_epochs: 1, eval_every: 5}\n",
        0,
    ),
]


@pytest.mark.parametrize(
    ("target", "budget", "code"),
    [case[1:] for case in BUDGET_EDGES],
    ids=[case[0] for case in BUDGET_EDGES],
)
def test_a_budget_at_its_edge_runs_to_its_end(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tag: str,
    target: str,
    budget: str,
    code: int,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(
        "task: tests.tasks:blobs\n"
        + target
        + QUIET_SPACE
        + "probe: none\nconfirm: {top: 0}\n"
        + (budget or "budget: {trials: 2, max_epochs: 1}\n")
    )
    result = cli(capsys, "run", "study.yaml", "--quiet")
    assert result.code == code and "Traceback" not in result.err, result.err
    assert result.out.startswith("Study study: 2 trials")
    trials = trials_of(tmp_path)
    assert finished(trials) == 2 and all(t.state.name != "RUNNING" for t in trials)
    assert all(t.state.name != "FAIL" for t in trials), reasons(trials)


def test_a_batch_range_reaching_past_the_training_set_is_cut_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    """Reference: batch sizes too large for the training set beside ones that fit are removed with a
    notice; a range from 512 to 8192 over 1024 samples keeps 512 to 1024, so no trial fails for
    it."""
    monkeypatch.chdir(tmp_path)
    space = QUIET_SPACE.replace("batch_size: [32, 64]", "batch_size: {low: 512, high: 8192}")
    (tmp_path / "study.yaml").write_text(HEAD + space + TINY.replace("trials: 2", "trials: 3"))
    result = cli(capsys, "run", "study.yaml", "--quiet")
    assert "Traceback" not in result.err, result.err
    trials = trials_of(tmp_path)
    assert not [r for r in reasons(trials) if "larger than" in r], reasons(trials)
    assert result.code == 0 and "batch_size" in result.err and "removed" in result.err, result.err


# ---------------------------------------------------------------------------------------------
# 9. autotune.tune misused


def _ok(config: dict) -> tuple[float, float]:
    return 1.0, 0.95


def _api_kwargs(tmp_path: Path) -> dict[str, Any]:
    return dict(
        target=0.9,
        name="misuse",
        storage=f"sqlite:///{tmp_path / 'misuse.db'}",
        budget={"trials": 2},
        confirm={"top": 0},
        probe="none",
    )


def _blobs_data() -> dict[str, Any]:
    from tests.tasks import _blobs

    return dict(train=_blobs(256, 0), val=_blobs(128, 1))


API_REFUSED = [
    ("budget as text", lambda: dict(objective=_ok, budget="fast"), ("SpecError",), "budget"),
    ("space as text", lambda: dict(objective=_ok, space="lr"), ("SpecError",), "space"),
    ("space as a list", lambda: dict(objective=_ok, space=[1, 2]), ("SpecError",), "space"),
    ("confirm as a list", lambda: dict(objective=_ok, confirm=[1]), ("SpecError",), "confirm"),
    ("baseline as a number", lambda: dict(objective=_ok, baseline=5), ("SpecError",), "baseline"),
    ("task as a name", lambda: dict(task="tests.tasks:blobs"), ("SpecError", "TypeError"), "task"),
    (
        "model not callable",
        lambda: dict(model=42, **_blobs_data()),
        ("SpecError", "TypeError"),
        "model",
    ),
    (
        "objective not callable",
        lambda: dict(objective="train.py"),
        ("SpecError", "TypeError"),
        "objective",
    ),
    (
        "a misspelt keyword",
        lambda: dict(objective=_ok, budgett={"trials": 1}),
        ("TypeError",),
        "budgett",
    ),
    (
        "a knob of another name",
        lambda: dict(objective=_ok, space={"learning_rate": [0.1]}),
        ("SpecError",),
        "learning_rate",
    ),
    (
        "target NaN",
        lambda: dict(objective=_ok, target=float("nan")),
        ("SpecError",),
        "target.value",
    ),
    ("name with a newline", lambda: dict(objective=_ok, name="rings\nv2"), ("SpecError",), "name"),
    ("seed as text", lambda: dict(objective=_ok, seed="7"), ("SpecError",), "seed"),
]


@pytest.mark.parametrize(
    ("given", "types", "names"),
    [case[1:] for case in API_REFUSED],
    ids=[case[0] for case in API_REFUSED],
)
def test_tune_misused_raises_autotunes_error_naming_the_argument_before_anything_is_stored(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tag: str,
    given: Callable[[], dict[str, Any]],
    types: tuple[str, ...],
    names: str,
) -> None:
    """Reference: errors in the arguments raise autotune's errors naming autotune.tune() (Python's
    own TypeError where Python raises it first); one line; nothing trained, no storage made."""
    import autotune

    monkeypatch.chdir(tmp_path)
    kwargs = {**_api_kwargs(tmp_path), **given()}
    with pytest.raises(Exception) as info:
        autotune.tune(**kwargs)
    error = info.value
    assert type(error).__name__ in types or (
        isinstance(error, autotune.errors.AutotuneError) and "SpecError" in types
    ), f"{type(error).__module__}.{type(error).__name__}: {error}"
    assert names in str(error) and "\n" not in str(error), str(error)
    if isinstance(error, autotune.errors.AutotuneError):
        assert str(error).startswith("autotune.tune(): "), str(error)
    assert not (tmp_path / "misuse.db").exists()


def test_tune_with_a_folder_as_its_storage_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tag: str
) -> None:
    import autotune

    monkeypatch.chdir(tmp_path)
    (tmp_path / "db").mkdir()
    with pytest.raises(
        autotune.errors.StorageError, match=r"^autotune.tune\(\): storage: .*db is a directory"
    ):
        autotune.tune(
            **{**_api_kwargs(tmp_path), "storage": f"sqlite:///{tmp_path / 'db'}"}, objective=_ok
        )
    assert list((tmp_path / "db").iterdir()) == []


@pytest.mark.parametrize(
    "returns, why",
    [
        (lambda config: None, "returned None"),
        (lambda config: (1.0, float("nan")), "finite"),
        (lambda config: {"seconds": 1.0}, "expected (seconds, metric)"),
        (
            lambda config: (_ for _ in ()).throw(ValueError("loss exploded")),
            "ValueError: loss exploded",
        ),
    ],
    ids=["returns None", "returns a NaN metric", "returns a dict without a metric", "raises"],
)
def test_an_objective_that_misbehaves_fails_its_trials_and_leaves_none_running(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tag: str,
    returns: Callable[[dict], Any],
    why: str,
) -> None:
    """Reference: an exception fails that trial and the study goes on; tune() returns its
    summary."""
    import autotune

    monkeypatch.chdir(tmp_path)
    summary = autotune.tune(
        **_api_kwargs(tmp_path), objective=returns, space={"batch_size": [16, 32]}
    )
    assert summary.counts.failed == 2 and summary.counts.running == 0 and summary.best is None
    trials = trials_of(tmp_path, storage=f"sqlite:///{tmp_path / 'misuse.db'}", name="misuse")
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"] and all(
        why in r for r in reasons(trials)
    ), reasons(trials)
