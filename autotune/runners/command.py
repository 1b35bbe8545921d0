"""Trials that run the user's own training command, for scripts written for any trainer.

Each trial launches the command (its arguments filled from the configuration, command_inputs.py)
in a process group of its own, reads its reports (protocol.py) as they come, and keeps the
time-to-target clock itself: from just before the launch to the moment a report reaching the
target is read. Then the whole group (the script, its DataLoader workers, anything it started)
is stopped: SIGTERM, a short grace, SIGKILL; and so is any process under it that left the group
(descendants.py; the process itself is command_process.py's). Its stdout and stderr are read as
they come (so that neither can fill a pipe), kept in a log a run (command_log.py), matched
against the study's patterns where it reads its figures from them (output_metrics.py), and their
last lines kept for a failure's reason.

Outcomes: a report reaching the target -> reached. The clock at `limits.max_seconds` -> killed,
not reached ("max_seconds"). Exit status 0 without reaching -> not reached ("max_epochs": the
script ran its schedule). A failure (`TrialFailure`) otherwise: an exit status other than 0 or a
signal ("crashed: ..." with the last lines of its output, or "out of memory: ..." with oom=True when
they show an allocation failure), no metric reported at all ("no metric: ..."), or no outcome
after `hang_after` wall seconds ("timeout: ...").
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from autotune.runners import command_inputs, protocol
from autotune.runners.command_log import OutputLog
from autotune.runners.command_process import Group, LineReader, exit_status
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.runners.output_metrics import Patterns
from autotune.runners.tally import Tally
from autotune.spec import command_line
from autotune.train import oom, telemetry
from autotune.train.config import Limits, Progress, TrialConfig, TrialResult

# how often the command's exit is checked; reports are read the moment they come
POLL_SECONDS = 0.05
STDERR_LINES = 20  # the last lines of its output kept for a failure's reason
REASON_LINE_CHARS = 300  # of each line quoted in a failure's reason


def command_trial(
    command: str | Sequence[str],
    *,
    cwd: Path,
    hang_after: float,
    metric_name: str,
    env: Mapping[str, str] | None = None,
    devices: int = 1,
    patterns: Mapping[str, str] | None = None,
    logs: Path | None = None,
    written: Mapping[str, Mapping[Any, str]] | None = None,
) -> RunTrial:
    """A RunTrial that runs `command` in `cwd` with the trial's configuration filled in.

    `env` adds variables (placeholders filled as in the command) to the environment autotune runs
    in; `written` maps a placeholder's values to the script's own terms (the task's `values:`).
    Placeholders are checked for form here; `validate` also checks their names. With
    `devices` > 1 the command runs once a device under torch.distributed's launcher (launched).
    """
    args, env = command_line.split(command), dict(env or {})
    # a malformed placeholder is an error now, not at every trial
    command_line.placeholders(args, env)

    def run_trial(
        config: TrialConfig,
        *,
        limits: Limits,
        device: torch.device,
        seed: int,
        progress: Progress | None = None,
    ) -> TrialResult:
        if config.schedule_epochs is not None:  # the command's max_epochs is its schedule's length
            limits = dataclasses.replace(limits, max_epochs=config.schedule_epochs)
        with command_inputs.trial_folder() as folder:
            argv, child_env = command_inputs.inputs_for(
                args,
                env,
                config,
                folder=Path(folder),
                limits=limits,
                device=device,
                seed=seed,
                metric_name=metric_name,
                written=written,
                processes=devices,
            )
            return _run(
                launched(argv, devices),
                patterns=Patterns(patterns) if patterns else None,
                log=OutputLog(logs, seed) if logs is not None else None,
                launcher=devices > 1,
                cwd=cwd,
                env=child_env,
                limits=limits,
                hang_after=hang_after,
                metric_name=metric_name,
                device=device,
                progress=progress,
            )

    return run_trial


def launched(argv: list[str], devices: int) -> list[str]:
    """`argv` as one process a device under torch.distributed's launcher (torchrun), on this
    machine, rendezvous on a free port of its own (--standalone); as it is for one device."""
    if devices == 1:
        return argv
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={devices}",
        "--no-python",  # argv[0] is the program: python (this interpreter) or another
        *argv,
    ]


def _run(
    argv: list[str],
    *,
    patterns: Patterns | None,
    log: OutputLog | None,
    launcher: bool,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    hang_after: float,
    metric_name: str,
    device: torch.device,
    progress: Progress | None,
) -> TrialResult:
    read_fd, write_fd = os.pipe()
    # under a launcher the ranks reach the pipe by path: this process keeps its end open for them
    reach = (
        {
            protocol.REPORT_PIPE: str(os.fstat(write_fd).st_ino),
            protocol.REPORT_PATH: f"/proc/{os.getpid()}/fd/{write_fd}",
        }
        if launcher
        else {}
    )
    started = time.perf_counter()  # the clock: start-up counts
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, protocol.REPORT_FD: str(write_fd), **reach},
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            # read where its figures are read from its output
            stdout=subprocess.PIPE if patterns or log else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a group of its own, to stop with everything it starts
        )
    except OSError as exc:
        os.close(read_fd)
        if launcher:
            os.close(write_fd)
        raise TrialFailure(
            f"crashed: the command could not be started: {exc.strerror}: {argv[0]!r} (in {cwd})"
        ) from None
    finally:
        if not launcher:
            os.close(write_fd)  # the command holds its own copy
    group = Group(process)
    # the command's GPU, watched from here
    sampler = telemetry.Sampler(telemetry.nvml_reader(device)).start()
    try:
        result = _watch(
            group,
            read_fd,
            patterns=patterns,
            log=log,
            started=started,
            limits=limits,
            hang_after=hang_after,
            metric_name=metric_name,
            device=device,
            progress=progress,
        )
        return dataclasses.replace(result, gpu=sampler.stop())
    except TrialFailure as failure:  # where to read what it wrote
        where = log.where() if log is not None else ""
        raise TrialFailure(
            failure.reason + where, oom=failure.oom, diverged=failure.diverged
        ) from None
    finally:
        if log is not None:
            log.close()
        sampler.stop()
        group.stop()  # also when the target was reached, progress raised, or a signal arrived
        if launcher:
            os.close(write_fd)
        os.close(read_fd)
        process.stderr.close()
        if process.stdout is not None:
            process.stdout.close()


def _watch(
    group: Group,
    read_fd: int,
    *,
    patterns: Patterns | None,
    log: OutputLog | None,
    started: float,
    limits: Limits,
    hang_after: float,
    metric_name: str,
    device: torch.device,
    progress: Progress | None,
) -> TrialResult:
    reports, stderr = LineReader(read_fd), LineReader(group.process.stderr.fileno())
    stdout = LineReader(group.process.stdout.fileno()) if patterns or log else None
    outputs = [r for r in (reports, stderr, stdout) if r is not None]
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
    tally = Tally(limits=limits, device=device)
    # its errors, over all it writes: a rank's out-of-memory error can sit far above the
    # launcher's own lines about it
    errors = oom.FinalErrors()
    with selectors.DefaultSelector() as selector:
        for lines in outputs:
            selector.register(lines.fd, selectors.EVENT_READ, lines)
        while True:
            now = time.perf_counter() - started
            if now >= hang_after:
                raise TrialFailure(
                    f"timeout: no result after {hang_after:g} s of wall time; "
                    f"the command's process group was killed"
                )
            if now >= limits.max_seconds:  # what is read from here on is past the budget
                return _out_of_time(group, tally, elapsed=now, unmatched=_unmatched(patterns, tail))
            # before reading: all it wrote before exiting is then in the pipes
            exited = group.poll()
            if exited:
                for output in outputs:
                    output.drain()
            else:
                for key, _ in selector.select(
                    min(POLL_SECONDS, limits.max_seconds - now, hang_after - now)
                ):
                    if not key.data.read():
                        selector.unregister(key.fd)
            lines = stderr.take()
            errors.feed(lines)
            printed = stdout.take() if stdout is not None else []
            tail.extend([*printed, *lines])
            if log is not None:
                log.write([*printed, *lines])
            read = patterns.reports([*printed, *lines]) if patterns else []
            reached = _take_reports(
                [*read, *reports.take()],
                tally,
                started=started,
                metric_name=metric_name,
                progress=progress,
            )
            if reached is not None:
                return tally.result(stop_reason="target", elapsed=reached, memory=group.stop())
            if exited:
                return _after_exit(
                    group,
                    tally,
                    tail,
                    ran_out=errors.out_of_memory(),
                    elapsed=time.perf_counter() - started,
                    unmatched=_unmatched(patterns, tail),
                )
            # reports or not, its clock runs: a silent command is pruned too
            if progress is not None:
                elapsed = time.perf_counter() - started
                # a command evaluates on the clock, which autotune never pauses
                progress(tally.steps, tally.total_steps, tally.last_metric, elapsed, 0.0)


def _take_reports(
    lines: Iterable[str],
    tally: Tally,
    *,
    started: float,
    metric_name: str,
    progress: Progress | None,
) -> float | None:
    """Count the reports among `lines` in `tally`, each at the clock when it is read; the clock at
    the report that reached the target, or None."""
    for line in lines:
        seconds = time.perf_counter() - started
        report = protocol.parse(line, metric_name=metric_name)
        if report is None:
            tally.malformed(line)
            continue
        if seconds >= tally.limits.max_seconds:
            continue
        # as a task's NaN: diverged
        if report.metric is not None and not math.isfinite(report.metric):
            at = f" at step {report.step}" if report.step is not None else ""
            raise TrialFailure(
                f"diverged: the command reported {metric_name} {report.metric}{at}: its outputs "
                f"or its metric are not finite numbers",
                diverged=True,
            )
        tally.add(report, seconds=seconds)
        if progress is not None:
            progress(tally.steps, tally.total_steps, tally.last_metric, seconds, 0.0)
        if tally.reached:
            return seconds
    return None


def _unmatched(patterns: Patterns | None, tail: Sequence[str]) -> str | None:
    """Where a metric pattern never matched: the pattern and the last lines the command wrote."""
    if patterns is None or patterns.matched_metric or patterns.metric_pattern is None:
        return None
    lines = "".join(f"\n  | {line[:REASON_LINE_CHARS]}" for line in tail)
    return f"; no line of its output matched metric_from {patterns.metric_pattern!r}" + (
        f"; its last lines:{lines}" if lines else ", and it wrote nothing"
    )


def _out_of_time(
    group: Group, tally: Tally, *, elapsed: float, unmatched: str | None
) -> TrialResult:
    """The clock reached `max_seconds`: the best metric so far, or a failure without one."""
    if tally.best_metric is None:
        raise TrialFailure(
            f"timeout: no metric reported within the budget's max_seconds of "
            f"{tally.limits.max_seconds:g} s ({tally.reports} report(s) without one"
            f"{tally.malformed_note()}); the command's process group was killed" + (unmatched or "")
        )
    return tally.result(stop_reason="max_seconds", elapsed=elapsed, memory=group.stop())


def _after_exit(
    group: Group,
    tally: Tally,
    tail: Sequence[str],
    *,
    ran_out: str | None,
    elapsed: float,
    unmatched: str | None,
) -> TrialResult:
    code = group.process.returncode
    if code != 0:
        if ran_out is not None:
            raise TrialFailure(
                f"out of memory: {ran_out} (the command {exit_status(code)})"[:500], oom=True
            )
        last = next(
            (line.strip()[:REASON_LINE_CHARS] for line in reversed(tail) if line.strip()), ""
        )
        lines = "".join(f"\n  | {line[:REASON_LINE_CHARS]}" for line in tail)
        raise TrialFailure(
            f"crashed: the command {exit_status(code)}{': ' + last if last else ''}"
            + (f"\nlast lines of its output:{lines}" if lines else " and wrote nothing")
        )
    if tally.best_metric is None:
        raise TrialFailure(
            f"no metric: the command exited with status 0 after {elapsed:.1f} s but never called "
            f"autotune.report with a metric (received {tally.reports} report(s))"
            f"{tally.malformed_note()}" + (unmatched or "")
        )
    return tally.result(stop_reason="max_epochs", elapsed=elapsed, memory=group.stop())
