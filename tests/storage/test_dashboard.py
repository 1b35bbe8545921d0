"""`autotune dashboard STUDY`: optuna-dashboard on the study's storage, or a clear error."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.cli import main
from tests.study.test_study import REPO, write_study


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_optuna_dashboard_the_error_names_the_fix(tmp_path: Path) -> None:
    path = write_study(tmp_path)
    code = (
        "import sys; sys.modules['optuna_dashboard'] = None; from autotune.cli import main; "
        f"sys.exit(main(['dashboard', {str(path)!r}]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert (
        "pip install 'autotune[dashboard]'" in run.stderr
        and "pip install optuna-dashboard" in run.stderr
    )
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_a_missing_study_is_the_error_report_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    path = write_study(tmp_path)
    assert main(["report", str(path)]) == 2
    report = capsys.readouterr().err
    assert main(["dashboard", str(path)]) == 2
    assert capsys.readouterr().err == report and "no study database" in report
    assert not path.with_suffix(".db").exists()  # nothing created


def serve_then_ctrl_c(
    path: Path, *, preexec_fn: Callable[[], None] | None = None
) -> tuple[list[str] | None, subprocess.CompletedProcess[str], int]:
    """`autotune dashboard STUDY` in a process of its own: the study names it served once it
    listened, then how it ended after Ctrl-C, and its port."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", str(path), "--port", str(port)],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    names = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                # a loaded machine may take seconds to answer the first request
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/studies", timeout=30
                ) as response:
                    names = [s["study_name"] for s in json.load(response)["study_summaries"]]
                break
            # not listening yet (URLError, ConnectionError), or not answering yet (TimeoutError)
            except OSError:
                time.sleep(0.1)
        server.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = server.communicate(timeout=120)  # a loaded machine is slow to stop it
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return names, subprocess.CompletedProcess(server.args, server.returncode, out, err), port


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small study's file, its storage exactly as a real run leaves it: the dashboard only
    reads it, so every test that serves it shares it."""
    path = write_study(tmp_path_factory.mktemp("ran"), trials=2, confirm={"top": 0, "runs": 0})
    path.write_text(path.read_text() + "probe: none\n")  # nothing here is about the probe
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # so that `tests.tasks:blobs` imports
        assert main(["run", str(path), "--quiet"]) == 0
    return path


def test_serves_the_study_until_ctrl_c(ran: Path) -> None:
    path = ran
    names, ended, port = serve_then_ctrl_c(path)
    assert names == ["study"], ended.stderr
    assert ended.returncode == 130 and "Traceback" not in ended.stderr, ended.stderr
    assert f"http://127.0.0.1:{port}/" in ended.stdout.splitlines()[0]


def test_a_port_in_use_is_one_line_and_nothing_says_it_serves(
    ran: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ran
    capsys.readouterr()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["dashboard", str(path), "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out
    assert err.strip().splitlines() == [
        f"autotune: error: cannot serve the dashboard at 127.0.0.1:{port} "
        f"(Address already in use); choose another --port or --host"
    ], err


@pytest.mark.parametrize("how", ["ignored", "blocked"])
def test_ctrl_c_ends_a_dashboard_started_with_sigint_ignored_or_blocked(
    ran: Path, how: str
) -> None:
    """A script's background job starts with SIGINT ignored; a parent may have it blocked: both
    are inherited, and the dashboard would then serve on through Ctrl-C."""
    path = ran

    def inherit() -> None:
        if how == "ignored":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    names, ended, _ = serve_then_ctrl_c(path, preexec_fn=inherit)
    assert names == ["study"], ended.stderr
    assert ended.returncode == 130 and "Traceback" not in ended.stderr, ended.stderr
