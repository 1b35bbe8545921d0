"""autotune's sampler: Optuna's TPE, seeded by the seed scheme (record/seeds.py)."""

from __future__ import annotations

import warnings

import optuna

from autotune.record import seeds
from autotune.spec.study_file import StudySpec


def for_run(
    spec: StudySpec, *, stored_trials: int, worker: int | None
) -> optuna.samplers.BaseSampler:
    """The sampler of a run that finds `stored_trials` trials stored: a resumed study must not
    replay its first random configurations, and each worker draws its own."""
    seed = seeds.for_sampler(spec.seed, stored_trials=stored_trials, worker=worker)
    return tpe_sampler(seed=seed, trials=spec.budget.trials)


def tpe_sampler(*, seed: int, trials: int) -> optuna.samplers.TPESampler:
    """TPE for a study of `trials` trials. Optuna 5's TPE is multivariate by default already
    (benchmarks/search.py finds it searches exactly like the default TPE on an all-categorical
    space): what it adds is `group`, for the conditional prefetch_factor, and fewer random
    start-up trials in short studies. autotune's gains come from pruning and the probe."""
    with warnings.catch_warnings():
        # `group` is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=startup_trials(trials),
            multivariate=True,  # knobs interact (lr with batch size and schedule)
            group=True,  # prefetch_factor exists only with workers
        )


def startup_trials(trials: int) -> int:
    """The random trials TPE draws in a study of `trials` trials before it models them."""
    return max(3, min(10, trials // 3))
