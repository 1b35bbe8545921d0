"""How progress is shown on stderr: bars on a terminal, plain lines in a log, or nothing.

The mode is chosen once per run (`set_mode`, by `autotune run` from `--quiet` and whether stderr
is a terminal), never by the code that reports progress: that code asks for a `bar(...)`, and
says things with `say` (always shown) or `tell` (progress, hidden by `--quiet`).

- bars: tqdm bars, as on any terminal; TQDM_DISABLE=1 (benchmarks, the workers of `--workers`)
  still hides them, while messages print.
- lines: a CI log or a pipe has no use for carriage returns and redraws: one line when a phase
  begins, one per finished trial, and at most one every LINE_EVERY_SECONDS about a long one.
- quiet: no progress at all; notices, warnings, errors and the report (stdout) still print.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

MODES = ("bars", "lines", "quiet")
# Lines mode: the least time between two lines about one running phase (a trial's steps). A log
# reader wants to see that a long trial is alive, not a line per step.
LINE_EVERY_SECONDS = 10.0

_mode: str | None = None  # set once per run; None: not set (the Python API), chosen from stderr


def choose(*, quiet: bool, terminal: bool) -> str:
    """`--quiet` wins; a terminal gets bars; anything else (a CI log, a pipe, a file) gets lines."""
    return "quiet" if quiet else "bars" if terminal else "lines"


def set_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, but got {mode=}.")
    global _mode
    _mode = mode


def mode() -> str:
    """The mode set for this run; when none was set, the one `autotune run` would choose."""
    return _mode if _mode is not None else choose(quiet=False, terminal=_is_terminal(sys.stderr))


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _bars_disabled() -> bool:
    # Read at each bar, not when tqdm is imported (tqdm's own reading of it), so that setting it
    # later in a process still counts.
    return os.environ.get("TQDM_DISABLE", "").lower() not in ("", "0", "false")


def _write(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # flushed: a log shows each line as it happens


class Lines:
    """The part of tqdm's interface autotune uses, shown as plain lines (or not at all).

    `announce`: print "autotune: DESC: TOTAL UNITs" (or "autotune: DESC ...") when created.
    `every`: seconds between lines about the count; None: no such lines.
    """

    def __init__(
        self,
        desc: str,
        *,
        total: float | None = None,
        unit: str = "it",
        announce: bool = True,
        every: float | None = None,
    ) -> None:
        if every is not None and not every > 0:
            raise ValueError(f"every must be greater than 0 seconds or None, but got {every=}.")
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.n: float = 0
        self.postfix = ""
        self._last = time.monotonic()  # the first count line comes `every` seconds after the start
        if announce:
            _write(f"autotune: {desc}: {_count(total, unit)}" if total else f"autotune: {desc} ...")

    def update(self, n: float = 1) -> None:
        self.n += n
        self._maybe_write()

    def refresh(self) -> None:
        self._maybe_write()

    def reset(self, total: float | None = None) -> None:
        self.n = 0
        if total is not None:
            self.total = total

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        if refresh:
            self._maybe_write()

    def close(self) -> None:
        pass  # nothing to clear: a line once written stays

    def line(self) -> str:
        """The count as one line, e.g. "trial 3: 120/400 steps, accuracy=0.9512"."""
        count = (
            f"{self.n:g}/{_count(self.total, self.unit)}"
            if self.total
            else _count(self.n, self.unit)
        )
        return f"{self.desc}: {count}" + (f", {self.postfix}" if self.postfix else "")

    def _maybe_write(self) -> None:
        now = time.monotonic()
        if self.every is not None and now - self._last >= self.every:
            self._last = now
            _write(self.line())

    def __enter__(self) -> Lines:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


Bar = tqdm | Lines


def _count(number: float | None, unit: str) -> str:
    return f"{number:g} {unit}{'' if number == 1 else 's'}"


def bar(
    desc: str,
    *,
    total: float | None = None,
    unit: str = "it",
    leave: bool = True,
    announce: bool = True,
    every: float | None = None,
) -> Bar:
    """A progress bar for one phase: a tqdm bar in bars mode; otherwise `Lines` (see there),
    which prints nothing when quiet. `leave`: keep the finished bar on screen (bars mode)."""
    current = mode()
    if current == "bars":
        return tqdm(
            desc=desc,
            total=total,
            unit=unit,
            leave=leave,
            dynamic_ncols=True,
            disable=_bars_disabled(),
        )
    quiet = current == "quiet"
    return Lines(
        desc,
        total=total,
        unit=unit,
        announce=announce and not quiet,
        every=None if quiet else every,
    )


def show_run(bar: Bar, steps: int, total: int, metric: float | None, *, metric_name: str) -> None:
    """One training run's progress on its bar: its steps of `total`, and its last metric."""
    bar.total = total
    bar.update(steps - bar.n)
    if metric is not None:
        bar.set_postfix_str(f"{metric_name}={metric:.4f}", refresh=False)


def restart(bar: Bar, *, note: str = "") -> None:
    """Count a bar from zero for the next run, with `note` in place of what the last run showed
    (its metric is not the next one's)."""
    bar.reset()
    bar.set_postfix_str(note, refresh=False)


def say(message: str) -> None:
    """A message shown in every mode (a notice, a recovered trial): above the bars in bars mode."""
    if mode() == "bars":
        tqdm.write(message, file=sys.stderr)
    else:
        _write(message)


def tell(message: str, *, standing: str = "", routine: bool = False) -> None:
    """A line of progress, hidden by quiet. In lines mode `standing` (where the study stands) is
    added; in bars mode a `routine` one (a trial that completed) is left to the bar, which shows
    it."""
    current = mode()
    if current == "lines":
        _write(f"{message} ({standing})" if standing else message)
    elif current == "bars" and not routine:
        tqdm.write(message, file=sys.stderr)
