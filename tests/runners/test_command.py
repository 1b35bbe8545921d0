"""Trials that run a training command: the clock, the outcomes, every fault caused for real.

The commands are tests/commands/behaves.py in one mode or another, and the Lightning example
studies/lightning/train.py run with the command of studies/lightning_digits.yaml.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from autotune import signals
from autotune.runners import command_inputs, protocol
from autotune.runners.command import command_trial
from autotune.runners.isolation import TrialFailure
from autotune.runners.tally import Tally
from autotune.search.space import DEFAULT_BASELINE, KNOBS, SCHEDULERS, complete
from autotune.spec import command_line
from autotune.train import oom
from autotune.train.config import Limits, TrialConfig, TrialResult
from autotune.train.tasks import sgd
from autotune.train.training import make_scheduler
from tests.runners.test_isolation import alive, still_alive
from tests.tasks import lrs_of

REPO = Path(__file__).resolve().parents[2]
COMMANDS = REPO / "tests" / "commands"
CPU = torch.device("cpu")
BASELINE = TrialConfig.from_mapping(complete(DEFAULT_BASELINE))


def limits(*, target: float = 0.5, max_seconds: float = 30) -> Limits:
    return Limits(target=target, max_epochs=3, max_seconds=max_seconds, eval_every=0.25)


def run(
    mode: str,
    tmp_path: Path,
    *,
    hang_after: float = 60,
    config: TrialConfig = BASELINE,
    env: dict[str, str] | None = None,
    **kwargs: object,
) -> TrialResult:
    command = f"python behaves.py {mode} --out {tmp_path / 'info.json'}"
    run_trial = command_trial(
        command, cwd=COMMANDS, hang_after=hang_after, metric_name="accuracy", env=env
    )
    return run_trial(config, limits=kwargs.pop("limits", limits()), device=CPU, seed=7, **kwargs)


def info(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "info.json").read_text())


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_a_command_that_reaches_the_target_is_stopped_and_timed(tmp_path: Path) -> None:
    calls: list[tuple[int, int, float | None, float, float]] = []
    launched = time.perf_counter()
    # 0.05 more each 0.05 s
    result = run("climbs", tmp_path, progress=lambda *call: calls.append(call))
    returned = time.perf_counter() - launched
    assert result.reached and result.stop_reason == "target"
    assert result.best_metric == 0.5 and result.optimizer_steps == 10 and result.epochs == 1.0
    # stopped at the first report reaching it
    assert result.curve[-1] == (
        result.time_to_target,
        1.0,
        0.5,
    )
    # ten reports, start-up included
    assert 10 * 0.05 < result.time_to_target == result.train_seconds < returned
    # the rest of its 1000 steps (50 s) was not waited for
    assert returned < result.time_to_target + 5
    assert not alive(info(tmp_path)["pid"])
    steps = [c[0] for c in calls]  # every report, and the clock between reports
    assert steps == sorted(steps) and sorted(set(steps) - {0}) == list(range(1, 11))
    assert calls[-1] == (10, 20, 0.5, result.time_to_target, 0.0)
    # 32 samples at most every 0.05 s (sleeps only overrun)
    assert 0 < result.samples_per_second < 32 / 0.05 * 1.2
    assert result.peak_memory_bytes > 10 * 2**20  # a Python process with torch loaded


def test_a_command_short_of_the_target_is_killed_with_its_group_at_max_seconds(
    tmp_path: Path,
) -> None:
    launched = time.monotonic()
    result = run("plateau", tmp_path, limits=limits(max_seconds=2.0))
    assert (
        not result.reached and result.stop_reason == "max_seconds" and result.time_to_target is None
    )
    # killed at the limit, not run forever
    assert result.train_seconds >= 2.0 and time.monotonic() - launched < 30
    assert result.best_metric == 0.1 and all(point[0] < 2.0 for point in result.curve)
    # step of total_steps, over max_epochs
    assert result.epochs == result.optimizer_steps / 10**6 * 3
    pid, helper = info(tmp_path)["pid"], info(tmp_path)["helper"]
    assert not alive(pid) and not still_alive([helper])  # the process it started went with it
    assert group_members(pid) == []


@pytest.mark.parametrize("mode", ["daemons", "daemons_exit"])
def test_processes_a_command_started_outside_its_group_end_with_the_trial(
    tmp_path: Path, mode: str
) -> None:
    """A helper that called setsid() is in no group of the command's, and one whose parent exited
    at once belongs to nobody: both are found and ended with the trial, whether autotune stops
    the command or it exits on its own."""
    result = run(mode, tmp_path)
    assert result.reached
    started = info(tmp_path)
    assert still_alive([started["setsid"], started["orphan"]]) == [], started


def test_a_command_that_exits_short_of_the_target_is_infeasible(tmp_path: Path) -> None:
    result = run("short", tmp_path)
    assert not result.reached and result.stop_reason == "max_epochs"
    assert result.best_metric == 0.3 and [p[2] for p in result.curve] == [0.1, 0.3, 0.2]
    assert result.epochs == 3 and result.optimizer_steps == 3 and result.samples_per_second is None


def test_a_command_that_never_reports_a_metric_fails_saying_so(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("progress_only", tmp_path)
    assert failure.value.reason.startswith("no metric: the command exited with status 0")
    assert (
        "never called autotune.report with a metric (received 2 report(s))" in failure.value.reason
    )


def test_a_crash_is_reported_with_the_last_lines_of_stderr(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("crashes", tmp_path)
    reason = failure.value.reason
    assert reason.startswith("crashed: the command exited with status 3: stderr line 29\n"), reason
    assert "stderr line 10" in reason and "stderr line 9\n" not in reason  # the last 20 lines only
    assert not failure.value.oom


def test_a_segfault_is_a_crash(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("segfaults", tmp_path)
    assert failure.value.reason.startswith("crashed: the command was killed by SIGSEGV")


def test_an_out_of_memory_error_in_the_command_is_an_oom(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("oom", tmp_path)
    assert failure.value.oom
    assert failure.value.reason.startswith(
        "out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert failure.value.reason.endswith("(the command exited with status 1)")


def test_a_hang_is_a_timeout_and_is_killed(tmp_path: Path) -> None:
    launched = time.monotonic()
    with pytest.raises(TrialFailure) as failure:
        run("hangs", tmp_path, hang_after=1.5)
    assert failure.value.reason.startswith("timeout: no result after 1.5 s of wall time")
    assert time.monotonic() - launched < 5 and not alive(info(tmp_path)["pid"])


def test_no_metric_within_max_seconds_is_a_timeout(tmp_path: Path) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("hangs", tmp_path, limits=limits(max_seconds=1.0))
    assert failure.value.reason.startswith(
        "timeout: no metric reported within the budget's max_seconds of 1 s"
    )
    assert not alive(info(tmp_path)["pid"])


class Prune(Exception):
    pass


def test_an_exception_from_progress_kills_the_command_and_comes_out_unchanged(
    tmp_path: Path,
) -> None:
    prune = Prune("trial 3 pruned at step 2")

    def progress(
        steps: int, total: int, metric: float | None, seconds: float, paused: float
    ) -> None:
        assert paused == 0.0  # a command evaluates on its own clock, which runs
        if steps >= 2:
            raise prune

    with pytest.raises(Prune) as raised:
        run("plateau", tmp_path, progress=progress)
    assert raised.value is prune
    pid = info(tmp_path)["pid"]
    assert (
        not alive(pid) and not still_alive([info(tmp_path)["helper"]]) and group_members(pid) == []
    )


def test_ctrl_c_during_a_trial_kills_the_command_and_stops_the_run(tmp_path: Path) -> None:
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    with signals.handled(), pytest.raises(signals.Stopped):
        timer.start()
        with signals.interruptible():  # as the study runs a trial
            run("plateau", tmp_path)
    timer.join()
    pid = info(tmp_path)["pid"]
    assert (
        not alive(pid) and not still_alive([info(tmp_path)["helper"]]) and group_members(pid) == []
    )


def test_the_command_outlives_no_study_process_killed_with_sigkill(tmp_path: Path) -> None:
    study = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, torch; from pathlib import Path; "
                "from tests.runners.test_command import run, limits; "
                "run('plateau_py', Path(sys.argv[1]))"
            ),
            str(tmp_path),
        ],
        cwd=REPO,
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "info.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # past its first report, which starts its watch on the study
    study.kill()
    study.wait()
    pid, helper = info(tmp_path)["pid"], info(tmp_path)["helper"]
    deadline = time.monotonic() + 10
    while (alive(pid) or alive(helper)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid) and not alive(helper)
    # the killed process could not remove its trial's folder: the next command trial does, and
    # leaves a live process's alone
    host = socket.gethostname()
    left = list(Path(tempfile.gettempdir()).glob(f"autotune-trial-{host}:{study.pid}-*"))
    assert len(left) == 1 and (left[0] / "config.json").is_file()
    # the same process number on another host (a temporary folder shared with a container)
    elsewhere = Path(tempfile.mkdtemp(prefix=f"autotune-trial-elsewhere:{study.pid}-"))
    try:
        with command_inputs.trial_folder() as mine, command_inputs.trial_folder() as other:
            assert not left[0].exists() and elsewhere.is_dir()
            assert Path(mine).is_dir() and Path(other).is_dir()
        assert not Path(mine).exists()
    finally:
        elsewhere.rmdir()


def test_garbage_on_the_channel_is_ignored(tmp_path: Path) -> None:
    result = run("garbage", tmp_path, limits=limits(target=0.8))
    assert result.reached and result.optimizer_steps == 6
    # none reported, no total
    assert result.epochs is None and all(epochs is None for _, epochs, _ in result.curve)
    assert [p[2] for p in result.curve] == [0.4, 0.9]  # the 0.4 came under the metric's own name


def test_a_command_whose_every_line_was_malformed_is_told_so_and_shown_the_first(
    tmp_path: Path,
) -> None:
    with pytest.raises(TrialFailure) as failure:
        run("malformed", tmp_path)
    reason = failure.value.reason
    assert (
        reason.startswith("no metric: the command exited with status 0")
        and "received 0 report(s)" in reason
    )
    assert (
        "2 line(s) on the report channel were not JSON objects" in reason
        and "'epoch 1: accuracy 0.93'" in reason
    )


def test_a_non_finite_metric_from_a_command_is_a_divergence_as_a_tasks_is(tmp_path: Path) -> None:
    """One rule for NaN, whoever computes it: the trial ends there as diverged (pruned: it cannot
    win)."""
    with pytest.raises(TrialFailure) as failure:
        run("diverges", tmp_path)
    assert failure.value.diverged and not failure.value.oom
    assert failure.value.reason.startswith("diverged: the command reported accuracy nan at step 2")


def test_a_chatty_command_cannot_block_on_a_full_pipe(tmp_path: Path) -> None:
    result = run("chatty", tmp_path, hang_after=30)
    assert result.reached


def test_the_configuration_reaches_the_command_as_flags_a_json_file_and_the_environment(
    tmp_path: Path,
) -> None:
    # `width`: one of the user's own parameters, flat beside the knobs in as_dict
    config = TrialConfig.from_mapping(
        {**complete(DEFAULT_BASELINE), "lr": 0.25, "scheduler": "one cycle", "width": 48}
    )
    command = (
        f"python behaves.py echo --out {tmp_path / 'info.json'} --lr {{lr}} "
        "--max-epochs {max_epochs} "
        "--scheduler {scheduler} --prefetch-factor={prefetch_factor} {pin_memory:--pin-memory/} "
        "--pin={pin_memory} --width {width} --seed {seed} --device {device} --file {config_file}"
    )
    run_trial = command_trial(
        command,
        cwd=COMMANDS,
        hang_after=60,
        metric_name="accuracy",
        env={"WIDTH_FROM_ENV": "w{width}", "UNSET_FROM_ENV": "{prefetch_factor}"},
    )
    result = run_trial(config, limits=limits(), device=CPU, seed=11)
    assert result.reached
    seen = info(tmp_path)
    assert seen["argv"][2:] == [
        "--lr",
        "0.25",
        "--max-epochs",
        "3",
        "--scheduler",
        "one cycle",
        "--pin=False",
        "--width",
        "48",
        "--seed",
        "11",
        "--device",
        "cpu",
        "--file",
        seen["config_file"],
    ]
    assert seen["config"] == {
        "config": config.as_dict(),
        "seed": 11,
        "device": "cpu",
        "metric": "accuracy",
        "limits": {
            "target": 0.5,
            "minimize": False,
            "max_epochs": 3,
            "max_seconds": 30,
            "eval_every": 0.25,
        },
    }
    assert (
        seen["config"]["config"]["prefetch_factor"] is None
        and seen["config"]["config"]["width"] == 48
    )
    assert seen["env"] == "w48" and seen["unset"] is None
    assert not Path(seen["config_file"]).exists()  # removed with the trial


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        ("--lr={lr}", {"lr": 0.001}, "--lr=0.001"),
        ("{lr}", {"lr": 1e-05}, "1e-05"),
        ("{max_epochs}", {"max_epochs": 8.0}, "8"),  # reads back with type=int too
        ("{max_epochs}", {"max_epochs": 2.5}, "2.5"),
        ("{batch_size}", {"batch_size": 64}, "64"),
        ("{pin_memory}", {"pin_memory": True}, "True"),
        ("{pin_memory}", {"pin_memory": False}, "False"),
        ("{pin_memory:--pin-memory/--no-pin-memory}", {"pin_memory": False}, "--no-pin-memory"),
        ("{pin_memory:--pin-memory/}", {"pin_memory": True}, "--pin-memory"),
        ("{pin_memory:--pin-memory/}", {"pin_memory": False}, None),  # empty: left out
        # None: the argument is left out
        (
            "--prefetch-factor={prefetch_factor}",
            {"prefetch_factor": None},
            None,
        ),
        ("--prefetch-factor={prefetch_factor}", {"prefetch_factor": 4}, "--prefetch-factor=4"),
        ("{prefetch_factor:on/off}", {"prefetch_factor": None}, "off"),
        ("{{literal}}-{precision}", {"precision": "bf16"}, "{literal}-bf16"),
    ],
)
def test_placeholders_are_filled_as_documented(
    template: str, values: dict, expected: str | None
) -> None:
    assert command_line.fill(template, values) == expected


def test_a_string_command_is_split_like_a_shell_and_values_never_split() -> None:
    args = command_line.split("python 'my train.py' --name {name} --flag={flag}")
    assert args == ("python", "my train.py", "--name", "{name}", "--flag={flag}")
    assert command_line.fill_all(args, {"name": "a b; rm -rf x", "flag": None}) == [
        "python",
        "my train.py",
        "--name",
        "a b; rm -rf x",
    ]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("python train.py --lr {learning_rate}", "unknown placeholder {learning_rate}"),
        ("python train.py --bs {batchsize}", "(did you mean {batch_size}?)"),
        ("python train.py --lr {lr", "malformed placeholder in '{lr'"),
        ("python train.py --lr {lr!r}", "a placeholder is {name} or {name:IF_TRUE/IF_FALSE}"),
        ("python train.py --lr {lr:.3f}", "IF_TRUE/IF_FALSE, two texts split by one slash"),
        ("python train.py --x {0}", "a placeholder is {name}"),
        ("python 'train.py", "cannot be split into arguments: No closing quotation"),
        ("", "the command is empty"),
        (
            "no-such-program-here train.py",
            "'no-such-program-here' is not an executable file (on the PATH)",
        ),
        ("./train.py", "'./train.py' is not an executable file (relative to"),
    ],
)
def test_a_bad_command_is_an_error_before_any_trial_runs(command: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        command_line.validate(command, known=[*KNOBS, "width"], cwd=COMMANDS)
    assert message in str(error.value), str(error.value)


def test_a_good_command_validates_with_the_filled_names_and_the_parameters() -> None:
    command_line.validate(
        "python behaves.py {width} {seed} {device} {max_epochs} {config_file} {lr}",
        known=[*KNOBS, "width"],
        cwd=COMMANDS,
        env={"W": "{width}"},
    )
    with pytest.raises(ValueError, match="unknown placeholder {depth}"):
        command_line.validate("python behaves.py", known=KNOBS, env={"D": "{depth}"})


def test_a_program_that_cannot_start_is_a_failure(tmp_path: Path) -> None:
    run_trial = command_trial(
        [str(tmp_path / "missing"), "--lr", "{lr}"],
        cwd=tmp_path,
        hang_after=10,
        metric_name="accuracy",
    )
    with pytest.raises(
        TrialFailure, match="crashed: the command could not be started: No such file or directory"
    ):
        run_trial(BASELINE, limits=limits(), device=CPU, seed=1)


def test_report_is_a_no_op_without_autotune() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    done = subprocess.run(
        [sys.executable, "behaves.py", "plain"],
        cwd=COMMANDS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "reported nothing\n"


def test_report_lines_parse_as_documented() -> None:
    parse = protocol.parse
    assert parse(
        '{"step": 3, "metric": 0.5, "epoch": 0.25, "samples": 96, "total_steps": 40, "x": [1]}',
        metric_name="accuracy",
    ) == protocol.Report(step=3, metric=0.5, epoch=0.25, samples=96, total_steps=40)
    assert parse('{"step": 1, "accuracy": 0.7}', metric_name="accuracy").metric == 0.7
    assert (
        parse('{"step": 1, "metric": 0.6, "accuracy": 0.7}', metric_name="accuracy").metric == 0.6
    )
    for line in ("not json", "[1]", "3", ""):
        assert parse(line, metric_name="accuracy") is None
    for metric in ("true", '"0.9"', "null"):
        assert parse(f'{{"step": 1, "metric": {metric}}}', metric_name="accuracy").metric is None
    for metric in (
        "NaN",
        "Infinity",
        "-Infinity",
        "1" + "0" * 400,
    ):  # kept: a run that diverged says so
        assert not math.isfinite(
            parse(f'{{"step": 1, "metric": {metric}}}', metric_name="accuracy").metric
        )


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            [
                "Traceback (most recent call last):",
                '  File "train.py", line 3',
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            ],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            [
                "RuntimeError: [enforce fail at alloc_cpu.cpp:117] . "
                "DefaultCPUAllocator: can't allocate memory: you tried"
            ],
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] . "
            "DefaultCPUAllocator: can't allocate memory: you tried",
        ),
        (["Traceback (most recent call last):", "MemoryError"], "MemoryError"),
        (["ValueError: could not convert string to float: 'abc'"], None),
        (["MyMemoryErrorHandler: started", "SystemExit: 1"], None),
        # a log line that mentions memory, then a failure of another kind: not an OOM
        (
            [
                "warning: CUDA out of memory on the first try; retrying with half the batch",
                "MemoryError: cache full, evicting the oldest entries",
                "Traceback (most recent call last):",
                '  File "train.py", line 9, in <module>',
                "ValueError: label 11 is out of range",
            ],
            None,
        ),
        (["MemoryError: cache full, evicting", "Segmentation fault"], None),
        # a rank's OOM above the launcher's own error about it, prefixed as torchrun does
        (
            [
                "[rank0]: Traceback (most recent call last):",
                '[rank0]:   File "train.py", line 3, in <module>',
                "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                "Traceback (most recent call last):",
                '  File "/usr/bin/torchrun", line 8, in <module>',
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                "============================================================",
                "train.py FAILED",
            ],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        # C++ that nothing caught
        (
            [
                "terminate called after throwing an instance of 'c10::OutOfMemoryError'",
                "  what():  CUDA out of memory. Tried to allocate 2.00 GiB",
                "frame #0: c10::Error::Error() + 0x1",
            ],
            "c10.OutOfMemoryError",
        ),
    ],
)
def test_an_oom_is_recognised_in_stderr_by_its_final_error_as_in_process(
    lines: list[str], expected: str | None
) -> None:
    assert oom.oom_line(lines) == expected


def test_what_reports_leave_out_stays_unknown() -> None:
    tally = Tally(limits=limits(target=0.9), device=CPU)
    for seconds, line in ((1.0, '{"metric": 0.5}'), (2.0, '{"accuracy": 0.95}')):
        tally.add(protocol.parse(line, metric_name="accuracy"), seconds=seconds)
    result = tally.result(stop_reason="target", elapsed=2.0, memory=123)
    assert (
        result.reached
        and result.time_to_target == 2.0
        and result.curve == ((1.0, None, 0.5), (2.0, None, 0.95))
    )
    assert (
        result.optimizer_steps is None
        and result.epochs is None
        and result.samples_per_second is None
    )
    assert result.peak_memory_bytes == 123  # the process's own, as no report gave a figure
    assert result.train_loss is None  # no report carried one


def test_a_reported_loss_is_kept_beside_its_metric_and_a_missing_one_stays_missing() -> None:
    """A loss on a progress-only line has no point to stand beside; a non-finite one is none."""
    tally = Tally(limits=limits(target=0.9), device=CPU)
    lines = (
        '{"metric": 0.5, "loss": 1.25}',
        '{"step": 7, "loss": 0.9}',
        '{"metric": 0.6}',
        '{"metric": 0.7, "loss": NaN}',
        '{"metric": 0.95, "loss": 0.5}',
    )
    for seconds, line in enumerate(lines, start=1):
        tally.add(protocol.parse(line, metric_name="accuracy"), seconds=float(seconds))
    result = tally.result(stop_reason="target", elapsed=5.0, memory=123)
    assert [point[2] for point in result.curve] == [0.5, 0.6, 0.7, 0.95]
    assert result.train_loss == (1.25, None, None, 0.5)


# The Lightning example, with the study file's own command and budget.

STUDY = REPO / "studies" / "lightning_digits.yaml"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_lightning_example_reaches_the_study_target(precision: str) -> None:
    study = yaml.safe_load(STUDY.read_text())
    command_line.validate(study["task"]["command"], known=KNOBS, cwd=STUDY.parent)
    budget = study["budget"]
    # with room for a busy machine
    limits_ = Limits(
        target=study["target"]["value"],
        max_epochs=budget["max_epochs"],  # the study's,
        max_seconds=max(60, budget["max_seconds"]),
        eval_every=0.25,
    )
    config = TrialConfig.from_mapping(
        complete({**DEFAULT_BASELINE, "lr": 0.05, "precision": precision})
    )
    run_trial = command_trial(
        study["task"]["command"],
        cwd=STUDY.parent,
        hang_after=120,
        metric_name=study["target"]["metric"],
    )
    calls: list[tuple[int, int, float | None, float, float]] = []
    result = run_trial(
        config, limits=limits_, device=CPU, seed=3, progress=lambda *call: calls.append(call)
    )
    assert result.reached and result.stop_reason == "target", result
    assert result.curve[-1][2] == result.best_metric >= limits_.target
    # stopped at the first crossing
    assert all(metric < limits_.target for _, _, metric in result.curve[:-1])
    batches = (
        1797 - 359
    ) // 32  # training samples (digits less the 20% validation split) // batch size
    assert calls[-1] == (
        result.optimizer_steps,
        budget["max_epochs"] * batches,
        result.best_metric,
        result.time_to_target,
        0.0,  # its evaluations ran on its clock
    )
    assert 0 < result.epochs <= budget["max_epochs"] and result.samples_per_second is not None


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_lightning_example_trains_with_the_optimizer_and_schedules_of_a_trial(
    scheduler: str,
) -> None:
    """Its --scheduler means what the knob means in autotune's trials, for short runs (OneCycle's
    stretched warm-up, 1 step without a cycle) as for long ones."""
    spec = importlib.util.spec_from_file_location(
        "lightning_example", STUDY.parent / "lightning" / "train.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for total in (1, 2, 3, 4, 5, 8, 100):
        configured = example.DigitsCNN(
            lr=0.05, scheduler=scheduler, total_steps=total
        ).configure_optimizers()
        optimizer, lr_scheduler = configured["optimizer"], configured["lr_scheduler"]
        reference = sgd([torch.nn.Parameter(torch.zeros(1))], 0.05)
        expected = lrs_of(
            reference, make_scheduler(scheduler, reference, total_steps=total, lr=0.05), total
        )
        assert (
            lr_scheduler["interval"] == "step"
            and lrs_of(optimizer, lr_scheduler["scheduler"], total) == expected
        ), total
        assert reference.defaults == optimizer.defaults


def test_the_lightning_example_study_runs_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`autotune run studies/lightning_digits.yaml`, then export and report, cut to 1 trial and a
    confirmation of one run each (the file beside its script, as shipped otherwise). In this
    process, as the console script calls `main`: each Lightning launch costs seconds, a process
    importing torch for each command more (command trials run in this process elsewhere here)."""
    from autotune.cli import main

    (tmp_path / "lightning").symlink_to(STUDY.parent / "lightning")
    study = yaml.safe_load(STUDY.read_text())
    study["confirm"]["runs"] = 1
    (shipped := tmp_path / STUDY.name).write_text(yaml.safe_dump(study))
    storage = f"sqlite:///{tmp_path / 'lightning.db'}"
    capsys.readouterr()
    code = main(["run", str(shipped), "--trials", "1", "--storage", storage])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert "Study lightning_digits: 1 trial" in out and "Winner: " in out, out
    trials = optuna.load_study(study_name="lightning_digits", storage=storage).get_trials()
    # prune: incumbent in the study file (with one trial there is no incumbent to pass; a
    # command's pruned trials: tests/study/test_study.py)
    assert {t.state.name for t in trials} <= {
        "COMPLETE",
        "PRUNED",
    }
    for t in trials:
        if t.state.name == "PRUNED":
            assert (
                t.user_attrs["reason"].startswith("pruned: ")
                and "it can no longer win" in t.user_attrs["reason"]
            )
    code = main(["export", str(shipped), "--storage", storage, "--format", "args"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("--lr "), err
    # a command's study draws as well: no input wait or confusion matrix to show, the rest is there
    page = tmp_path / "report.html"
    code = main(["report", str(shipped), "--storage", storage, "--html", str(page)])
    _, err = capsys.readouterr()
    assert code == 0 and page.read_text().count('<img src="data:image/png;base64,') == 6, err


def test_importing_autotune_for_report_does_not_import_torch() -> None:
    """A script's `import autotune` runs on its trial's clock: it must stay cheap."""
    code = (
        "import sys, autotune; autotune.report(step=1, metric=0.5); "
        "assert 'torch' not in sys.modules; print(autotune.Task)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    # the rest of the API is still there, imported when used
    assert "autotune.train.tasks.Task" in result.stdout


def test_orphans_are_handed_to_autotune_only_while_a_command_runs(tmp_path: Path) -> None:
    """After the trial, a process a shell leaves behind is nobody's child here again (the other
    load measurement tells this process's own work from others' by its children)."""
    from autotune.runners import descendants

    run("daemons_exit", tmp_path)
    assert descendants.adopt_orphans(False) is False  # it was no subreaper after the trial
