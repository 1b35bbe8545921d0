"""The runner lock: one `autotune run` per storage file, and no lock file left once it is over."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import StorageError
from autotune.spec import study_file
from autotune.study import runner_lock

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

    def open_then_lose_the_race(path: object, mode: str) -> object:
        handle = open(path, mode)
        if not opened:  # the first open: the file is removed and made anew, held, before we lock it
            os.unlink(lock)
            holders.append(hold(lock, runner_lock.RUNNER_BYTE, "EX"))
        opened.append(handle)
        return handle

    monkeypatch.setattr(runner_lock, "open", open_then_lose_the_race, raising=False)
    try:
        with pytest.raises(StorageError, match="is being run by"):
            with runner_lock.sole_runner(spec, tmp_path / "study.db"):
                pass
        assert len(opened) == 2  # locked the removed file, saw it, and opened the one now there
    finally:
        for holder in holders:
            holder.stdin.close()
            holder.wait()
