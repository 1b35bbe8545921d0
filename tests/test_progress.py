"""Progress fits where it runs: bars on a terminal, a line per trial in a log, nothing with
--quiet."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
from tqdm import tqdm

from autotune import progress
from autotune.cli import main
from autotune.search.space import DEFAULT_BASELINE, KNOBS, Choices, Space, complete
from autotune.study import one_trial
from autotune.train.config import Limits, TrialResult
from tests.study.test_study import REPO, write_study

OUTCOME = re.compile(
    r"^trial (\d+): (complete|pruned|failed)\b.*\((\d+)/(\d+) finished; .*\)$", re.M
)


@pytest.fixture(autouse=True)
def mode_restored() -> Iterator[None]:
    before = progress._mode
    yield
    progress._mode = before


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    # TQDM_DISABLE would hide the bars this module checks for.
    return {**{k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}, "PYTHONPATH": path}


def autotune(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ...` with stdout and stderr piped, as in a CI log."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_choose_quiet_wins_then_a_terminal_gets_bars_and_anything_else_lines() -> None:
    assert progress.choose(quiet=True, terminal=True) == "quiet"
    assert progress.choose(quiet=False, terminal=True) == "bars"
    assert progress.choose(quiet=False, terminal=False) == "lines"
    with pytest.raises(ValueError, match="but got mode='fancy'"):
        progress.set_mode("fancy")


def test_lines_announce_once_then_count_at_most_every_interval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    progress.set_mode("lines")
    with progress.bar("confirming on fresh seeds", total=4, unit="run") as bar:
        assert isinstance(bar, progress.Lines)
        bar.update(1)
        bar.update(1)  # within `every` of nothing: no `every`, so no count lines at all
    assert capsys.readouterr().err == "autotune: confirming on fresh seeds: 4 runs\n"

    bar = progress.bar("trial 3", unit="step", announce=False, every=10)
    bar.total = 400
    bar.update(120)
    bar.set_postfix_str("accuracy=0.9512", refresh=False)
    assert capsys.readouterr().err == ""  # a short trial prints nothing
    now[0] += 10
    bar.update(1)
    now[0] += 5
    bar.refresh()  # 5 s after the last line: too soon
    assert (bar.n, bar.total) == (121, 400)
    assert capsys.readouterr().err == "trial 3: 121/400 steps, accuracy=0.9512\n"
    # the next run of the trial: the last one's metric is not its own
    progress.restart(bar, note="seed 2 of 3")
    assert bar.n == 0
    now[0] += 10
    bar.update(1)
    bar.close()
    assert capsys.readouterr().err == "trial 3: 1/400 steps, seed 2 of 3\n"


def test_a_restarted_tqdm_bar_drops_the_last_runs_metric() -> None:
    progress.set_mode("bars")
    bar = progress.bar("trial 3", total=400, unit="step")
    try:
        bar.update(120)
        bar.set_postfix_str("accuracy=0.9512", refresh=False)
        progress.restart(bar)
        assert bar.n == 0 and "accuracy" not in str(bar)
    finally:
        bar.close()


def test_messages_by_mode(capsys: pytest.CaptureFixture[str]) -> None:
    progress.set_mode("lines")
    progress.say("autotune: trial 2 was interrupted")
    progress.tell(
        "trial 1: complete in 0.50 s", standing="2/4 finished; best 0.50 s, trial 1", routine=True
    )
    assert capsys.readouterr().err == (
        "autotune: trial 2 was interrupted\n"
        "trial 1: complete in 0.50 s (2/4 finished; best 0.50 s, trial 1)\n"
    )
    progress.set_mode("quiet")
    progress.bar("study", total=4, unit="trial").update(4)
    progress.tell("trial 1: pruned: out of memory", standing="2/4 finished")
    progress.say("autotune: trial 2 was interrupted")  # a notice: quiet keeps it
    assert capsys.readouterr().err == "autotune: trial 2 was interrupted\n"
    progress.set_mode("bars")
    # the bar shows it
    progress.tell("trial 1: complete in 0.50 s", standing="2/4 finished", routine=True)
    progress.tell("trial 2: pruned: out of memory", standing="2/4 finished")
    assert capsys.readouterr().err == "trial 2: pruned: out of memory\n"


def test_bars_are_tqdm_and_tqdm_disable_hides_them(monkeypatch: pytest.MonkeyPatch) -> None:
    progress.set_mode("bars")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    with progress.bar("study", total=3, unit="trial") as bar:
        assert isinstance(bar, tqdm) and not bar.disable
    monkeypatch.setenv("TQDM_DISABLE", "1")
    with progress.bar("study", total=3, unit="trial") as bar:
        assert isinstance(bar, tqdm) and bar.disable


def small_study(tmp_path: Path, *, trials: int, confirm: dict) -> Path:
    """write_study's, without the systems probe: no test here is about it."""
    path = write_study(tmp_path, trials=trials, confirm=confirm)
    path.write_text(path.read_text() + "probe: none\n")
    return path


def test_a_log_gets_a_line_per_trial_and_no_carriage_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """stderr not a terminal, as in a CI log (`main` here: it chooses by sys.stderr.isatty(),
    which is False under capture as under a pipe; a terminal's bars are checked below)."""
    path = small_study(tmp_path, trials=3, confirm={"top": 1, "runs": 1})
    monkeypatch.chdir(REPO)  # so that `tests.tasks:blobs` imports
    code = main(["run", str(path)])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert "\r" not in err and "\x1b" not in err
    outcomes = OUTCOME.findall(err)
    assert sorted(int(number) for number, *_ in outcomes) == [0, 1, 2], err
    assert [finished for *_, finished, _ in outcomes] == ["1", "2", "3"], err
    assert "autotune: study: 3 trials\n" in err
    # the baseline and the best
    assert "autotune: confirming on fresh seeds: 2 runs\n" in err
    assert "Winner: " in out


def test_quiet_reaches_the_workers(tmp_path: Path) -> None:
    """--quiet: no line per trial, no study line, no confirmation line, from this process or
    its workers; the summary still on stdout."""
    path = small_study(tmp_path, trials=3, confirm={"top": 1, "runs": 1})
    run = autotune(
        "run",
        str(path),
        "--workers",
        "2",
        "--storage",
        f"journal:///{tmp_path / 'study.journal'}",
        "--quiet",
    )
    assert run.returncode == 0, run.stderr
    assert not re.search(
        r"^(trial \d+|autotune: study|autotune: confirming)|study created", run.stderr, re.M
    ), run.stderr
    assert "Study study: 3 trials" in run.stdout and "Winner: " in run.stdout


def test_beside_other_workers_a_trials_line_tells_where_the_study_stands_when_it_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Another worker finishes a faster trial while this one trains: this trial's line gives the
    count and the best as they are when it ends, not as they were read before its ask."""
    progress.set_mode("lines")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    space = Space(
        tuple(
            (name, Choices((value,)))
            for name, value in complete(DEFAULT_BASELINE).items()
            if name in KNOBS
        )
    )

    def result(seconds: float) -> TrialResult:
        return TrialResult(
            reached=True,
            time_to_target=seconds,
            best_metric=0.95,
            train_seconds=seconds,
            epochs=1.0,
            optimizer_steps=10,
            samples_per_second=None,
            peak_memory_bytes=None,
            device_name="cpu",
            torch_version=torch.__version__,
            stop_reason="target",
            curve=((seconds, 1.0, 0.95),),
        )

    def run(run_trial, *, alone: bool = False) -> None:
        policy = one_trial.Policy(
            space=space,
            run_trial=run_trial,
            device=torch.device("cpu"),
            limits=Limits(target=0.9, max_epochs=2, max_seconds=5, eval_every=0.5),
            seed=0,
            metric_name="accuracy",
            budget=4,
        )
        one_trial.run_one(
            study, policy, asked=[], known=study.get_trials(deepcopy=False), alone=alone
        )

    def slow_while_another_worker_finishes(config, **_) -> TrialResult:
        run(lambda config, **_: result(0.5))
        return result(2.0)

    run(slow_while_another_worker_finishes)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "trial 1: complete in 0.50 s, accuracy 0.9500 (1/4 finished; best 0.50 s, trial 1)",
        "trial 0: complete in 2.00 s, accuracy 0.9500 (2/4 finished; best 0.50 s, trial 1)",
    ]

    # alone: what was read before the ask is current
    run(lambda config, **_: result(1.0), alone=True)
    assert (
        capsys.readouterr().err
        == "trial 2: complete in 1.00 s, accuracy 0.9500 (3/4 finished; best 0.50 s, trial 1)\n"
    )


def test_a_terminal_gets_bars(tmp_path: Path) -> None:
    path = small_study(tmp_path, trials=2, confirm={"top": 0, "runs": 0})
    controller, terminal = pty.openpty()
    # tqdm draws nothing 0 wide
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path)],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    try:
        while True:  # read as it comes: a full terminal buffer would block the run
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # the run closed its end
                    break
                if not chunk:
                    break
                seen += chunk
            elif process.poll() is not None:
                break
        out = process.stdout.read().decode()
        assert process.wait(timeout=60) == 0, seen
    finally:
        os.close(controller)
        process.kill() if process.poll() is None else None
    err = seen.decode()
    assert re.search(r"\rstudy: +100%\|.*\| 2/2 ", err), err  # a bar, redrawn in place
    assert not OUTCOME.search(err.replace("\r\n", "\n"))  # no per-trial lines: the bar shows them
    assert "Study study: 2 trials" in out
