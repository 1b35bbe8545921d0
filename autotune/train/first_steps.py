"""A process's first steps on a device, taken once and untimed before any setting is timed.

A process's first steps load what every later one reuses (on a GPU the CUDA libraries' handles
and their first kernels: 1 s on an H200, where a later step of the same kind started in 0.1 s).
Timed, that would land on whichever setting happened to be measured first, and a setting's
start-up decides which runs it wins (search/roofline.py). What only a narrower precision, cuDNN's
search or a fused step loads still lands on the first such setting measured: a trial of it in a
fresh process pays that too. What the first steps took beyond the same steps taken again is kept
as a figure of its own: a trial in a fresh process pays it, one in a warm process once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from autotune.train import oom
from autotune.train.config import TrialConfig

_taken: set[str] = set()  # the devices whose first steps this process has taken


def plain(config: TrialConfig) -> TrialConfig:
    """`config`'s step at fp32 in no special format: what every other step loads too."""
    return dataclasses.replace(
        config,
        precision="fp32",
        channels_last=False,
        cudnn_benchmark=False,
        tf32=False,
        fused_optimizer=False,
        compile=False,
    )


def take_once(device: torch.device, session: Callable[[], Any]) -> float | None:
    """Build `session()` (a plain step that takes a few steps; its `startup_seconds` timed, its
    `close()`) twice, unless this process has on `device`: the first build's start-up beyond the
    second's is what the process's first steps loaded, returned. None where this process has
    taken them, or a step ran out of memory (tried once: it would again, and the settings' own
    sessions meet that limit, each a result)."""
    if str(device) in _taken:
        return None
    _taken.add(str(device))
    try:
        first, later = (_start_up(session()) for _ in range(2))
        return max(0.0, first - later)
    except Exception as exc:
        if not oom.is_oom(exc):
            raise
    oom.free_memory()  # out of the handler: the failed step's tensors went with the exception
    return None


def _start_up(session: Any) -> float:
    session.close()
    return session.startup_seconds
