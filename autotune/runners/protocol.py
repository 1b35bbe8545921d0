"""The reporting protocol: how a training command tells autotune how far it got.

A script that autotune runs as a command (`task: {command: ...}` in the study file) calls, after
each evaluation,

    import autotune
    autotune.report(step=trainer.global_step, metric=val_accuracy, epoch=epoch)

Run without autotune, `report` does nothing and returns None: the script stays a plain script.

The protocol, for scripts in any language
-----------------------------------------
autotune starts the command with these environment variables:

    AUTOTUNE_REPORT_FD  number of an open file descriptor (the write end of a pipe) to report on;
                        a command on several devices (devices_per_trial) runs under
                        torch.distributed's launcher, which closes it in the ranks: there
                        AUTOTUNE_REPORT_PATH is a path that opens the same pipe for writing
                        (AUTOTUNE_REPORT_PIPE: its inode), and only rank 0 (RANK) reports
    AUTOTUNE_CONFIG     path of a JSON file: {"config": {knob or parameter: value, ...},
                        "seed": int, "device": "cpu" | "cuda" | "cuda:N", "metric": "accuracy",
                        "limits": {"target", "minimize", "max_epochs", "max_seconds",
                        "eval_every"}} (minimize: true where lower is better, a loss)
                        (a prefetch_factor without workers is null)

A report is one JSON object on one line (UTF-8, ending in a newline) written to that descriptor,
each line in one write so that lines from several processes do not interleave (a pipe keeps
writes of up to 4096 bytes whole). The keys, all optional:

    step               int    optimizer steps so far
    metric             float  validation metric (higher is better, or lower where the target says
                              direction: minimize); absent or null: a progress-only
                              report. When absent, the key named like the study's metric (e.g.
                              "accuracy") is read instead.
    epoch              float  epochs of training data seen so far
    loss               float  with a metric: the mean training loss since the previous report
                              with one (stored beside the metric; a non-finite one is left out)
    samples            int    training samples seen so far (for the throughput figure)
    total_steps        int    optimizer steps the run is to take (the progress bar's total)
    peak_memory_bytes  int    the script's own peak memory figure (e.g.
                              torch.cuda.max_memory_allocated)
    seconds            float  the script's own clock: allowed, but not used

Other keys are ignored, as are lines that are not a JSON object and values of the wrong type
(a progress bar or a stray print on the descriptor cannot end a trial). A metric that is not a
finite number (NaN, from a diverged run) counts as no metric. Python's NaN/Infinity literals are
accepted.

The clock is autotune's, not the script's: a trial's time to target is the wall time from just
before the command is launched (interpreter start, imports and data loading count, as DataLoader
worker start-up does for a built-in task) to the moment autotune reads the first report whose
metric reaches the target. Evaluation time is on this clock too, unlike a built-in task's paused
one: evaluate on a small set, or evaluate less often. The script is then stopped (SIGTERM to its
process group, then SIGKILL), so anything after that report is not waited for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import threading
from typing import Any

from autotune.runners import watchdog

REPORT_FD = "AUTOTUNE_REPORT_FD"
# A command on several devices runs under torch.distributed's launcher, which starts its ranks
# with no inherited descriptor but 0-2: there the pipe (its inode, REPORT_PIPE) is reached by
# REPORT_PATH, the study's own end of it under /proc.
REPORT_PIPE = "AUTOTUNE_REPORT_PIPE"
REPORT_PATH = "AUTOTUNE_REPORT_PATH"
CONFIG = "AUTOTUNE_CONFIG"
# the process running the study: the script ends itself when it is gone
STUDY_PID = "AUTOTUNE_STUDY_PID"
WATCH_SECONDS = 0.5


def report(*, step: int, metric: float | None = None, **more: Any) -> None:
    """Report progress, and after an evaluation the validation metric, to autotune; see the
    module's doc.

    Tensors and NumPy scalars are written as numbers. Without autotune, does nothing.
    """
    fd = os.environ.get(REPORT_FD)
    if not fd or os.environ.get("RANK", "0") != "0":  # under a launcher, rank 0 reports
        return None
    line = json.dumps({"step": step, "metric": metric, **more}, default=_plain) + "\n"
    _watch_study()
    try:
        _write_all(_report_fd(int(fd)), line.encode())
    except BrokenPipeError:  # the study's end of the pipe is closed: nobody will read this trial
        _end_trial()
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"{REPORT_FD}={fd!r} is not a file descriptor open in this process ({exc}); "
            f"was the script started by a tool that closes inherited descriptors?"
        ) from None
    return None


_opened: list[int] = []  # the pipe, opened by its path in this process


def _report_fd(fd: int) -> int:
    """`fd` where it is the study's pipe; else (a launcher closed it, and another file may have
    its number) the pipe opened by its path."""
    pipe = os.environ.get(REPORT_PIPE)
    if not pipe:
        return fd
    if _opened:
        return _opened[0]
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_ino == int(pipe):
            return fd
    _opened.append(os.open(os.environ[REPORT_PATH], os.O_WRONLY))
    return _opened[0]


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # a one-element tensor or a NumPy scalar
        return value.item()
    return str(value)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


_watching = threading.Event()


def _watch_study() -> None:
    """Once per process: end the trial's processes if the study's process dies without stopping
    them (SIGKILL, a crash), so that no orphan keeps training and slows the next run's trials."""
    pid = os.environ.get(STUDY_PID, "")
    if _watching.is_set() or not pid.isdigit():
        return
    _watching.set()

    watchdog.on_death(int(pid), _end_trial, every=WATCH_SECONDS)


def _end_trial() -> None:
    """Kill this trial's processes: the whole process group when it is a session's own (autotune
    starts each command with a session of its own), else this process alone."""
    if os.getpgid(0) == os.getsid(0):
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


# What autotune reads from a line: the parsing half of the protocol.


@dataclasses.dataclass(frozen=True)
class Report:
    step: int | None = None
    metric: float | None = None
    epoch: float | None = None
    samples: int | None = None
    total_steps: int | None = None
    peak_memory_bytes: int | None = None
    loss: float | None = None


def parse(line: str | bytes, *, metric_name: str) -> Report | None:
    """The report on one line, or None for a line that is not a JSON object."""
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        return None
    if not isinstance(data, dict):
        return None
    metric = data.get("metric")
    if metric is None:
        metric = data.get(metric_name)
    return Report(
        step=_whole(data.get("step")),
        metric=_metric(metric),
        epoch=_number(data.get("epoch")),
        samples=_whole(data.get("samples")),
        total_steps=_whole(data.get("total_steps")),
        peak_memory_bytes=_whole(data.get("peak_memory_bytes")),
        loss=_number(data.get("loss")),
    )


def _metric(value: Any) -> float | None:
    """A number, NaN and infinities included (a run that diverged reports them: the caller says
    so, as for a task's), or None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer too large for a float
            return math.inf
    return None


def _number(value: Any) -> float | None:
    """A finite number, or None for anything else (null, a string, true, NaN, Infinity)."""
    number = _metric(value)
    return number if number is not None and math.isfinite(number) else None


def _whole(value: Any) -> int | None:
    number = _number(value)
    return None if number is None or number < 0 else int(number)
