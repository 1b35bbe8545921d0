"""The runner lock: one `autotune run` per storage file, and no lock file left once it is over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import StorageError
from autotune.spec import study_file
from autotune.storage import runner_lock

HEAD = "task: digits\ntarget: {metric: accuracy, value: 0.97}\n"


def spec_in(folder: Path) -> study_file.StudySpec:
    (folder / "study.yaml").write_text(HEAD)
    return study_file.load(folder / "study.yaml")


def hold(path: Path, byte: int, how: str) -> subprocess.Popen[str]:
    """Another process holding `byte` of the lock file at `path` until its stdin closes."""
    code = (
        f"import fcntl, sys; f = open({str(path)!r}, 'a+'); "
        "f.write('autotune (pid 99)'); f.flush(); "
        f"fcntl.lockf(f, fcntl.LOCK_{how}, 1, {byte}); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_run_that_ends_removes_its_lock_file(tmp_path: Path) -> None:
    spec, storage = spec_in(tmp_path), tmp_path / "study.db"
    with runner_lock.sole_runner(spec, storage):
        assert (tmp_path / "study.db.runner.lock").exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "study.yaml"]


def test_a_second_runner_is_refused_while_the_first_holds_the_lock(tmp_path: Path) -> None:
    spec, lock = spec_in(tmp_path), tmp_path / "study.db.runner.lock"
    holder = hold(lock, runner_lock.RUNNER_BYTE, "EX")
    try:
        with pytest.raises(StorageError, match=r"is being run by autotune \(pid 99\)"):
            with runner_lock.sole_runner(spec, tmp_path / "study.db"):
                pass
        assert lock.exists()  # the refused run removes nothing
    finally:
        holder.stdin.close()
        holder.wait()


def test_a_lock_file_a_worker_still_holds_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker of this run still running at its end (it outlived its parent's wait): the next
    run must find the file, and wait on its byte."""
    spec, lock = spec_in(tmp_path), tmp_path / "study.db.runner.lock"
    # it is this run's own
    monkeypatch.setattr(runner_lock, "_wait_for_earlier_workers", lambda *args: None)
    with runner_lock.sole_runner(spec, tmp_path / "study.db"):
        worker = hold(lock, runner_lock.WORKERS_BYTE, "SH")
    try:
        assert lock.exists()
    finally:
        worker.stdin.close()
        worker.wait()


def test_a_lock_taken_on_a_file_removed_meanwhile_is_taken_again_on_the_file_now_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between this run's open and its lock, the run before removed the file and another made it
    anew and holds it: the lock on the removed file guards nothing, so this run must be refused."""
    spec, lock = spec_in(tmp_path), tmp_path / "study.db.runner.lock"
    lock.write_text("")
    holders: list[subprocess.Popen[str]] = []
    opened = []

    open_lock = runner_lock._open_lock

    def open_then_lose_the_race(*args: object) -> object:
        handle = open_lock(*args)
        if not opened:  # the first open: the file is removed and made anew, held, before we lock it
            os.unlink(lock)
            holders.append(hold(lock, runner_lock.RUNNER_BYTE, "EX"))
        opened.append(handle)
        return handle

    monkeypatch.setattr(runner_lock, "_open_lock", open_then_lose_the_race)
    try:
        with pytest.raises(StorageError, match="is being run by"):
            with runner_lock.sole_runner(spec, tmp_path / "study.db"):
                pass
        assert len(opened) == 2  # locked the removed file, saw it, and opened the one now there
    finally:
        for holder in holders:
            holder.stdin.close()
            holder.wait()


# A lock file's name taken by something else: each is refused and left exactly as it was.


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_left_whole(
    tmp_path: Path,
) -> None:
    spec = spec_in(tmp_path)
    other = tmp_path / "other.db"
    other.write_bytes(b"SQLite format 3\x00 another study's database")
    for target in (tmp_path / "study.yaml", other):
        before = target.read_bytes()
        link = tmp_path / "study.db.runner.lock"
        link.symlink_to(target)
        with pytest.raises(StorageError, match="is a symbolic link"):
            with runner_lock.sole_runner(spec, tmp_path / "study.db"):
                pass
        assert target.read_bytes() == before and link.is_symlink()
        link.unlink()


def test_a_lock_file_with_other_names_or_other_contents_is_refused_and_left_whole(
    tmp_path: Path,
) -> None:
    spec, lock = spec_in(tmp_path), tmp_path / "study.db.runner.lock"
    before = (tmp_path / "study.yaml").read_bytes()
    os.link(tmp_path / "study.yaml", lock)  # a hard link: the same file under the lock's name
    with pytest.raises(StorageError, match="has other names"):
        with runner_lock.sole_runner(spec, tmp_path / "study.db"):
            pass
    assert (tmp_path / "study.yaml").read_bytes() == before
    lock.unlink()
    lock.write_text("notes of mine\n")
    with pytest.raises(StorageError, match="holds something other than"):
        with runner_lock.sole_runner(spec, tmp_path / "study.db"):
            pass
    assert lock.read_text() == "notes of mine\n"
    lock.unlink()
    os.mkfifo(lock)  # opening a FIFO must not wait for a writer
    with pytest.raises(StorageError, match="is no plain file"):
        with runner_lock.sole_runner(spec, tmp_path / "study.db"):
            pass


# The same storage under another name, in another process or this one.


def run_holding(storage: Path) -> subprocess.Popen[str]:
    """Another process that holds the runner's lock on `storage` (as `autotune run` does) until
    its stdin closes."""
    code = (
        "import sys; from pathlib import Path; from autotune.spec import study_file; "
        "from autotune.storage import runner_lock; "
        f"spec = study_file.load(Path({str(storage.parent / 'study.yaml')!r})); "
        f"cm = runner_lock.sole_runner(spec, Path({str(storage)!r})); cm.__enter__(); "
        "print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_storage_reached_by_a_link_or_another_spelling_is_refused_while_another_process_runs_it(
    tmp_path: Path,
) -> None:
    spec = spec_in(tmp_path)
    storage = tmp_path / "study.db"
    storage.write_bytes(b"")
    (tmp_path / "soft.db").symlink_to(storage)
    os.link(storage, tmp_path / "hard.db")
    (tmp_path / "sub").mkdir()
    holder = run_holding(storage)
    try:
        for alias in ("soft.db", "hard.db", "sub/../study.db"):
            with pytest.raises(StorageError, match="is being run by"):
                with runner_lock.sole_runner(spec, tmp_path / alias):
                    pass
    finally:
        holder.stdin.close()
        holder.wait()
    for alias in ("soft.db", "hard.db"):  # free once it has ended
        with runner_lock.sole_runner(spec, tmp_path / alias):
            pass


def test_a_storage_made_after_the_lock_is_held_by_its_identity_once_it_exists(
    tmp_path: Path,
) -> None:
    """A new study's file is made after its runner took the lock: a hard link made to it then
    reaches a file the runner holds."""
    spec, storage = spec_in(tmp_path), tmp_path / "study.db"
    with runner_lock.sole_runner(spec, storage) as claim:
        storage.write_bytes(b"")
        claim.hold_file()
        os.link(storage, tmp_path / "hard.db")
        code = (
            "import sys; from pathlib import Path; from autotune.spec import study_file; "
            "from autotune.storage import runner_lock; from autotune.errors import StorageError\n"
            f"spec = study_file.load(Path({str(tmp_path / 'study.yaml')!r}))\n"
            "try:\n"
            f"    with runner_lock.sole_runner(spec, Path({str(tmp_path / 'hard.db')!r})): pass\n"
            "except StorageError as error: print(error)\n"
        )
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "under another name" in other.stdout, other.stdout + other.stderr


def test_a_second_run_in_this_process_is_refused_before_it_touches_the_lock(
    tmp_path: Path,
) -> None:
    """Record locks are the process's: a second run from another thread (or from a trial) would
    take them again and let go of them as it ended."""
    spec = spec_in(tmp_path)
    lock = tmp_path / "study.db.runner.lock"
    with runner_lock.sole_runner(spec, tmp_path / "study.db"):
        with pytest.raises(StorageError, match="being run by this process already"):
            with runner_lock.sole_runner(spec, tmp_path / "study.db"):
                pass
        assert lock.exists()
        other = subprocess.run(  # still held against other processes
            [
                sys.executable,
                "-c",
                f"import fcntl; fcntl.lockf(open({str(lock)!r}, 'a+'), "
                "fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)",
            ],
            capture_output=True,
            text=True,
        )
        assert other.returncode != 0 and "Resource temporarily unavailable" in other.stderr
