"""A failed trial's stored reason: what went wrong, in one line, and where in the user's code."""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from pathlib import Path

import torch

from autotune.train import oom
from autotune.train.config import Diverged


def error_reason(exc: BaseException) -> str:
    """`Type: first line (at file:line)`, for the trial's stored reason."""
    if oom.is_oom(exc):
        return oom.oom_reason(exc)
    # not an error in anyone's code: where it was noticed says nothing
    if isinstance(exc, Diverged):
        return f"diverged: {exc}"
    text = str(exc).strip()
    worker, marker, original = text.partition(WORKER_TRACEBACK)
    # re-raised by the DataLoader from a worker process: the worker's own error is in the text
    if marker:
        lines = [line.strip() for line in original.strip().splitlines() if line.strip()]
        # "IndexError: list index out of range"
        last = lines[-1] if lines else exc.__class__.__name__
        process = re.search(r"in (DataLoader worker process \d+)", worker)
        where = _where(
            [
                (path, int(line))
                for path, line in re.findall(r'File "([^"]+)", line (\d+)', original)
            ]
        )
        context = ", ".join(
            part
            for part in (
                f"in {process.group(1)}" if process else "",
                f"at {where}" if where else "",
            )
            if part
        )
        return last[:400] + (f" ({context})" if context else "")
    where = _where(
        [(frame.filename, frame.lineno) for frame in traceback.extract_tb(exc.__traceback__)]
    )
    first_line = (text.splitlines() or [""])[0]
    return f"{exc.__class__.__name__}: {first_line}"[:400] + (f" (at {where})" if where else "")


WORKER_TRACEBACK = "Original Traceback (most recent call last):"
# Where a user's error is not: torch's, autotune's and Python's own code, and installed packages.
_NOT_THE_USERS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in (Path(torch.__file__).parent, Path(__file__).parent, sysconfig.get_paths()["stdlib"])
)


def _where(places: list[tuple[str, int]]) -> str:
    """`file:line` of the innermost place in the user's code, else of the innermost place."""
    if not places:
        return ""
    users = [
        (path, line)
        for path, line in places
        if not str(Path(path).resolve()).startswith(_NOT_THE_USERS) and "site-packages" not in path
    ]
    path, line = (users or places)[-1]
    return f"{path}:{line}"
