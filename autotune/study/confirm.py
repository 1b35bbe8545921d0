"""Re-measure the best configurations and the baseline on fresh seeds, side by side and
interleaved, so that all see the same machine load; what the runs mean is record/verdict.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from autotune.record import runs
from autotune.record.verdict import BASELINE, baseline_resolved
from autotune.runners.isolation import RunTrial, TrialFailure
from autotune.train.config import Limits, TrialConfig


def measure(
    run_trial: RunTrial,
    candidates: Mapping[str, Mapping[str, Any]],
    *,
    seeds: Sequence[int],
    limits: Limits,
    device: torch.device,
    on_run: Callable[[], None] | None = None,
    until_resolved: bool = False,
) -> list[dict[str, Any]]:
    """Run every candidate once per seed, interleaved; one record per run. With `until_resolved`,
    the baseline's runs stop once `baseline_resolved`.

    A run that fails (runs out of memory, hangs, crashes) counts as not reaching the target.
    """
    records: list[dict[str, Any]] = []
    for seed in seeds:
        for label, config in candidates.items():
            if label == BASELINE and until_resolved and baseline_resolved(records):
                continue
            try:
                result = run_trial(
                    TrialConfig.from_mapping(config), limits=limits, device=device, seed=seed
                )
            except TrialFailure as failure:
                record = runs.failed_confirmation(failure.reason, label=label, seed=seed)
            else:
                record = runs.confirmation(result, label=label, seed=seed)
            records.append(record)
            if on_run is not None:
                on_run()
    return records
