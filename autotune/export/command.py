"""`--format command`: the study's own command line, filled with the winner's values exactly as
its trial ran them (the task's `values:` maps, its `env:`, the thread settings autotune gave it, its
seed), as one line to paste into a POSIX shell:

    cd /path/to/project && OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 python train.py --lr=0.002 ...

`python` stays as the study file writes it: in a trial it was the Python running autotune (its
folder first on PATH), here it is the shell's.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.export.common import provenance
from autotune.record.summary import Summary
from autotune.search.recipe import thread_env
from autotune.search.space import SCHEDULE, filled
from autotune.spec import command_line

LAUNCHER = ("torchrun", "--standalone")  # torch.distributed.run's own command


def render(
    summary: Summary,
    *,
    task: Any,
    folder: Path,
    seed: int,
    device: str,
    limits: Mapping[str, float],
) -> str:
    """The winner's command line, after a comment saying where it came from. `task` is the stored
    definition's task (what the trials ran), `folder` the one they ran in."""
    if not isinstance(task, Mapping) or "command" not in task:
        raise AutotuneError(
            f"--format command: study {summary.study!r} trains a built-in or Python task, not a "
            f"command of its own; --format torch, lightning, hf, args, json or yaml write it"
        )
    template = command_line.split(task["command"])
    env = dict(task.get("env") or {})
    if "config_file" in command_line.placeholders(template, env):
        raise AutotuneError(
            "--format command: the command names {config_file}, the JSON file autotune writes "
            "for each trial; --format json writes the winner's settings for a file of your own"
        )
    assert summary.best is not None
    config = filled(summary.best.params)
    values = {
        **config,
        "seed": seed,
        "device": device,
        "max_epochs": config.get(SCHEDULE) or limits["max_epochs"],
        "eval_every": limits["eval_every"],
    }
    written = {name: dict(map(tuple, pairs)) for name, pairs in (task.get("values") or {}).items()}
    try:
        argv = command_line.fill_all(template, values, written)
        variables = {
            **thread_env(config.get("num_workers") or 0, processes=summary.devices_per_trial),
            **{name: command_line.fill(value, values, written) for name, value in env.items()},
        }
    except KeyError as missing:
        raise AutotuneError(
            f"--format command: the command names {{{missing.args[0]}}}, which the winner's "
            f"stored settings lack"
        ) from None
    if summary.devices_per_trial > 1:  # as its trials ran: one process a device, under torchrun
        argv = [*LAUNCHER, f"--nproc-per-node={summary.devices_per_trial}", "--no-python", *argv]
    assignments = [f"{name}={shlex.quote(v)}" for name, v in variables.items() if v is not None]
    line = " ".join(["cd", shlex.quote(str(folder)), "&&", *assignments, shlex.join(argv)])
    return f"# {provenance(summary)}, seed {seed}\n{line}\n"
