"""What a command trial gives the user's command: its configuration file (protocol.CONFIG), its
arguments and its environment, their placeholders filled from the configuration
(command_line.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from autotune.runners import protocol
from autotune.runners.isolation import TrialFailure
from autotune.search.recipe import thread_env
from autotune.spec import command_line
from autotune.train.config import Limits, TrialConfig

FOLDER_PREFIX = "autotune-trial-"


def trial_folder() -> tempfile.TemporaryDirectory:
    """A temporary folder for one trial's inputs, named after this process (host:pid): removed
    when the trial ends, and, where the process that made one was killed before it could remove
    it (SIGKILL), by the next command trial on this host. Only this host's: a temporary folder
    shared with another host (or container) names processes this one cannot see."""
    host = socket.gethostname()
    for leftover in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{host}:*-*"):
        pid = leftover.name.removeprefix(f"{FOLDER_PREFIX}{host}:").split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)) and _mine(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{host}:{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _mine(path: Path) -> bool:
    """A folder of this user's, not a link: never remove what another user or a link points to."""
    status = path.lstat()
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid()


def inputs_for(
    args: list[str],
    env: dict[str, str],
    config: TrialConfig,
    *,
    folder: Path,
    limits: Limits,
    device: torch.device,
    seed: int,
    metric_name: str,
    written: Mapping[str, Mapping[Any, str]] | None = None,
    processes: int = 1,
) -> tuple[list[str], dict[str, str]]:
    """The command's arguments and its whole environment for one trial, with its configuration
    file written in `folder`; values in the script's own terms where `written` maps them, and the
    thread settings an in-process trial gets (recipe.thread_env) unless `env` names them."""
    config_file = _write_config(
        folder / "config.json",
        config,
        limits=limits,
        device=device,
        seed=seed,
        metric_name=metric_name,
    )
    values = {
        **config.as_dict(),
        "seed": seed,
        "device": str(device),
        "max_epochs": limits.max_epochs,
        "eval_every": limits.eval_every,
        "config_file": str(config_file),
    }
    env = {**thread_env(config.num_workers, processes=processes), **env}
    return _filled(args, env, values, written or {}, config_file=config_file)


def _write_config(
    path: Path,
    config: TrialConfig,
    *,
    limits: Limits,
    device: torch.device,
    seed: int,
    metric_name: str,
) -> Path:
    """The trial's configuration file (protocol.CONFIG), written to `path`."""
    path.write_text(
        json.dumps(
            {
                "config": config.as_dict(),
                "seed": seed,
                "device": str(device),
                "metric": metric_name,
                "limits": {
                    "target": limits.target,
                    "minimize": limits.minimize,
                    "max_epochs": limits.max_epochs,
                    "max_seconds": limits.max_seconds,
                    "eval_every": limits.eval_every,
                },
            },
            indent=1,
        )
    )
    return path


def _filled(
    args: list[str],
    env: dict[str, str],
    values: Mapping[str, object],
    written: Mapping[str, Mapping[Any, str]],
    *,
    config_file: Path,
) -> tuple[list[str], dict[str, str]]:
    """The command's arguments and its whole environment, their placeholders filled."""
    try:
        argv = command_line.fill_all(args, values, written)
        filled = {name: command_line.fill(t, values, written) for name, t in env.items()}
    except KeyError as exc:  # the spec loader validates names; this is the fallback
        raise TrialFailure(
            f"crashed: the command names {{{exc.args[0]}}}, which the configuration lacks"
        ) from None
    child_env = {**os.environ, **filled}
    # None: unset
    child_env = {name: value for name, value in child_env.items() if value is not None}
    child_env.update(
        {
            "PATH": command_line.search_path(child_env),
            protocol.CONFIG: str(config_file),
            protocol.STUDY_PID: str(os.getpid()),
        }
    )
    return argv, child_env
