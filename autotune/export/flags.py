"""`--format args`: one line of command-line flags, one per setting, for a script's argparse.

`--batch-size 64` for batch_size; booleans as `--pin-memory` / `--no-pin-memory` (argparse's
BooleanOptionalAction); floats written so that float() gives back the same number; a value
starting with "-" attached with "="; every word quoted for a POSIX shell. A setting that does not
exist (prefetch_factor without workers) is left out; a knob the study predates is written as its
trials ran without it (`--no-compile`: common.settings).
"""

from __future__ import annotations

import shlex
from typing import Any

from autotune.errors import AutotuneError
from autotune.export.common import settings
from autotune.record.summary import Summary


def flag(name: str, value: Any) -> list[str]:
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [option if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, (int, float, str)):
        # repr round-trips: 0.1 stays 0.1
        text = repr(value) if isinstance(value, float) else str(value)
        # argparse would read a value starting with "-" as an option of its own: attach it.
        return [f"{option}={text}"] if text.startswith("-") else [option, text]
    raise AutotuneError(f"--format args: {name} is {value!r}, which has no command-line form")


def render(summary: Summary) -> str:
    words = [
        w
        for name, value in settings(summary).items()
        if value is not None
        for w in flag(name, value)
    ]
    return shlex.join(words) + "\n"
