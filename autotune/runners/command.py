"""Trials that run the user's own training command, for scripts written for any trainer.

Each trial launches the command (its arguments filled from the configuration, command_line.py) in a
process group of its own, reads its reports (protocol.py) as they come, and keeps the
time-to-target clock itself: from just before the launch to the moment a report reaching the
target is read. Then the whole group (the script, its DataLoader workers, anything it started)
is stopped: SIGTERM, a short grace, SIGKILL; and so is any process under it that left the group
(descendants.py). The command's stdout is discarded; its stderr is
read as it comes (so that it cannot fill a pipe) and its last lines kept for a failure's reason.

Outcomes: a report reaching the target -> reached. The clock at `limits.max_seconds` -> killed,
not reached ("max_seconds"). Exit status 0 without reaching -> not reached ("max_epochs": the
script ran its schedule). A failure (`TrialFailure`) otherwise: an exit status other than 0 or a
signal ("crashed: ..." with the last lines of stderr, or "out of memory: ..." with oom=True when
they show an allocation failure), no metric reported at all ("no metric: ..."), or no outcome
after `hang_after` wall seconds ("timeout: ...").
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from autotune.runners import protocol
from autotune.runners.descendants import Descendants
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.runners.tally import Tally
from autotune.spec import command_line
from autotune.train import oom, telemetry
from autotune.train.config import Limits, Progress, TrialConfig, TrialResult

STOP_GRACE_SECONDS = 1.0  # between SIGTERM and SIGKILL: time to flush logs, not to finish training
POLL_SECONDS = (
    0.05  # how often the command's exit is checked; reports are read the moment they come
)
STDERR_LINES = 20  # the last lines of stderr kept for a failure's reason
MAX_LINE_BYTES = 65536  # a longer line (or one without an end) is cut, so memory stays bounded
REASON_LINE_CHARS = 300  # of each stderr line quoted in a failure's reason


def command_trial(
    command: str | Sequence[str],
    *,
    cwd: Path,
    hang_after: float,
    metric_name: str,
    env: Mapping[str, str] | None = None,
) -> RunTrial:
    """A RunTrial that runs `command` in `cwd` with the trial's configuration filled in.

    `env` adds variables (placeholders filled as in the command) to the environment autotune runs
    in. Placeholders are checked for form here; `validate` also checks their names.
    """
    args, env = command_line.split(command), dict(env or {})
    command_line.placeholders(
        args, env
    )  # a malformed placeholder is an error now, not at every trial

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
        with tempfile.TemporaryDirectory(prefix="autotune-trial-") as folder:
            config_file = Path(folder) / "config.json"
            config_file.write_text(
                json.dumps(
                    {
                        "config": config.as_dict(),
                        "seed": seed,
                        "device": str(device),
                        "metric": metric_name,
                        "limits": {
                            "target": limits.target,
                            "max_epochs": limits.max_epochs,
                            "max_seconds": limits.max_seconds,
                            "eval_every": limits.eval_every,
                        },
                    },
                    indent=1,
                )
            )
            values = {
                **config.as_dict(),
                "seed": seed,
                "device": str(device),
                "max_epochs": limits.max_epochs,
                "eval_every": limits.eval_every,
                "config_file": str(config_file),
            }
            try:
                argv = command_line.fill_all(args, values)
                filled = {
                    name: command_line.fill(template, values) for name, template in env.items()
                }
            except KeyError as exc:  # the spec loader validates names; this is the fallback
                raise TrialFailure(
                    f"crashed: the command names {{{exc.args[0]}}}, which the configuration lacks"
                ) from None
            child_env = {**os.environ, **filled}
            child_env = {
                name: value for name, value in child_env.items() if value is not None
            }  # None: unset
            child_env.update(
                {
                    "PATH": command_line.search_path(child_env),
                    protocol.CONFIG: str(config_file),
                    protocol.STUDY_PID: str(os.getpid()),
                }
            )
            return _run(
                argv,
                cwd=cwd,
                env=child_env,
                limits=limits,
                hang_after=hang_after,
                metric_name=metric_name,
                device=device,
                progress=progress,
            )

    return run_trial


def _run(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    hang_after: float,
    metric_name: str,
    device: torch.device,
    progress: Progress | None,
) -> TrialResult:
    read_fd, write_fd = os.pipe()
    started = time.perf_counter()  # the clock: start-up counts
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**env, protocol.REPORT_FD: str(write_fd)},
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a group of its own, to stop with everything it starts
        )
    except OSError as exc:
        os.close(read_fd)
        raise TrialFailure(
            f"crashed: the command could not be started: {exc.strerror}: {argv[0]!r} (in {cwd})"
        ) from None
    finally:
        os.close(write_fd)  # the command holds its own copy
    group = _Group(process)
    sampler = telemetry.Sampler(
        telemetry.nvml_reader(device)
    ).start()  # the command's GPU, watched from here
    try:
        result = _watch(
            group,
            read_fd,
            started=started,
            limits=limits,
            hang_after=hang_after,
            metric_name=metric_name,
            device=device,
            progress=progress,
        )
        return dataclasses.replace(result, gpu=sampler.stop())
    finally:
        sampler.stop()
        group.stop()  # also when the target was reached, progress raised, or a signal arrived
        os.close(read_fd)
        process.stderr.close()


def _watch(
    group: _Group,
    read_fd: int,
    *,
    started: float,
    limits: Limits,
    hang_after: float,
    metric_name: str,
    device: torch.device,
    progress: Progress | None,
) -> TrialResult:
    reports, stderr = _Lines(read_fd), _Lines(group.process.stderr.fileno())
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
    tally = Tally(limits=limits, device=device)
    with selectors.DefaultSelector() as selector:
        for lines in (reports, stderr):
            selector.register(lines.fd, selectors.EVENT_READ, lines)
        while True:
            now = time.perf_counter() - started
            if now >= hang_after:
                raise TrialFailure(
                    f"timeout: no result after {hang_after:g} s of wall time; "
                    f"the command's process group was killed"
                )
            if now >= limits.max_seconds:  # what is read from here on is past the budget
                if tally.best_metric is None:
                    raise TrialFailure(
                        f"timeout: no metric reported within the budget's max_seconds of "
                        f"{limits.max_seconds:g} s ({tally.reports} report(s) without one"
                        f"{tally.malformed_note()}); the command's process group was killed"
                    )
                return tally.result(stop_reason="max_seconds", elapsed=now, memory=group.stop())
            exited = (
                group.poll()
            )  # before reading: all it wrote before exiting is then in the pipes
            if exited:
                reports.drain()
                stderr.drain()
            else:
                for key, _ in selector.select(
                    min(POLL_SECONDS, limits.max_seconds - now, hang_after - now)
                ):
                    if not key.data.read():
                        selector.unregister(key.fd)
            tail.extend(stderr.take())
            for line in reports.take():
                seconds = time.perf_counter() - started
                report = protocol.parse(line, metric_name=metric_name)
                if report is None:
                    tally.malformed(line)
                    continue
                if seconds >= limits.max_seconds:
                    continue
                if report.metric is not None and not math.isfinite(
                    report.metric
                ):  # as a task's NaN: diverged
                    at = f" at step {report.step}" if report.step is not None else ""
                    raise TrialFailure(
                        f"diverged: the command reported {metric_name} {report.metric}{at}: its outputs or "
                        f"its metric are not finite numbers",
                        diverged=True,
                    )
                tally.add(report, seconds=seconds)
                if progress is not None:
                    progress(tally.steps, tally.total_steps, tally.last_metric, seconds)
                if tally.reached:
                    return tally.result(stop_reason="target", elapsed=seconds, memory=group.stop())
            if exited:
                return _after_exit(group, tally, tail, elapsed=time.perf_counter() - started)
            if (
                progress is not None
            ):  # reports or not, its clock runs: a silent command is pruned too
                progress(
                    tally.steps, tally.total_steps, tally.last_metric, time.perf_counter() - started
                )


def _after_exit(group: _Group, tally: Tally, tail: Sequence[str], *, elapsed: float) -> TrialResult:
    code = group.process.returncode
    if code != 0:
        line = oom.oom_line(tail)
        if line is not None:
            raise TrialFailure(
                f"out of memory: {line} (the command {_status(code)})"[:500], oom=True
            )
        last = next(
            (line.strip()[:REASON_LINE_CHARS] for line in reversed(tail) if line.strip()), ""
        )
        lines = "".join(f"\n  | {line[:REASON_LINE_CHARS]}" for line in tail)
        raise TrialFailure(
            f"crashed: the command {_status(code)}{': ' + last if last else ''}"
            + (f"\nlast lines of its stderr:{lines}" if lines else " and wrote nothing to stderr")
        )
    if tally.best_metric is None:
        raise TrialFailure(
            f"no metric: the command exited with status 0 after {elapsed:.1f} s but never called "
            f"autotune.report with a metric (received {tally.reports} report(s)){tally.malformed_note()}"
        )
    return tally.result(stop_reason="max_epochs", elapsed=elapsed, memory=group.stop())


def _status(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = (
            " (from outside the trial: often the kernel's out-of-memory killer)"
            if -code == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{hint}"
    return f"exited with status {code}"


class _Group:
    """The command's process and its process group: polled, and stopped once, whatever happens."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process, self.max_rss, self._stopped = process, 0, False
        self.descendants = Descendants(process.pid)  # those that leave the group (setsid) too

    def poll(self) -> bool:
        """True once the command's process has exited (reaped here, to read its peak memory)."""
        self.descendants.sample()
        if self.process.returncode is None:
            pid, status, usage = os.wait4(self.process.pid, os.WNOHANG)
            if pid == 0:
                return False
            self.process.returncode = os.waitstatus_to_exitcode(status)
            self.max_rss = usage.ru_maxrss * 1024  # Linux reports KiB
        return True

    def stop(self) -> int:
        """SIGTERM the group, a grace, then SIGKILL whatever is left of it (workers a script
        leaves behind too) and every process found under the command that left the group;
        returns the command's peak resident memory in bytes."""
        if self._stopped:
            return self.max_rss
        self._stopped = True
        if self.process.returncode is None:
            try:
                self._signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_GRACE_SECONDS
                while not self.poll() and time.monotonic() < deadline:
                    time.sleep(0.02)
            finally:  # a second Ctrl-C during the grace still leaves nothing behind
                self._signal(signal.SIGKILL)
                if self.process.returncode is None:
                    _, status, usage = os.wait4(self.process.pid, 0)
                    self.process.returncode = os.waitstatus_to_exitcode(status)
                    self.max_rss = usage.ru_maxrss * 1024
        else:
            self._signal(signal.SIGKILL)
        self.descendants.end()
        return self.max_rss

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(
                self.process.pid, signum
            )  # the group's id is the command's pid (a new session)
        except (ProcessLookupError, PermissionError):  # the whole group is gone already
            pass


class _Lines:
    """Complete lines from a non-blocking file descriptor; a carriage return also ends a line, so
    that a progress bar's updates do not pile up into one endless line."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd, self._partial, self._lines = fd, b"", []

    def read(self) -> bool:
        """Read what is there; False at end of file (the line in progress then counts as complete)."""
        return self._read_some() is not None

    def _read_some(self) -> int | None:
        """Bytes read: 0 when nothing is there now, None at end of file."""
        try:
            chunk = os.read(self.fd, 65536)
        except BlockingIOError:
            return 0
        except OSError:  # closed under us: as good as the end
            chunk = b""
        data = (self._partial + chunk).replace(b"\r", b"\n")
        *complete, self._partial = data.split(b"\n")
        if not chunk:
            complete, self._partial = [*complete, self._partial], b""
        self._partial = self._partial[-MAX_LINE_BYTES:]
        self._lines.extend(line[:MAX_LINE_BYTES] for line in complete if line)
        return len(chunk) or None

    def drain(self) -> None:
        """Read what is there, up to 1 MiB (a process that exited wrote all it will write, though
        a process it left behind may go on writing)."""
        for _ in range(16):
            if not self._read_some():
                return

    def take(self) -> list[str]:
        lines, self._lines = self._lines, []
        return [line.decode(errors="replace") for line in lines]
