"""The joint probe's first step (run.py): every loader setting's rate and every
compute setting's, measured apart at the probe's micro-batch, and each pair's speed predicted as
the slower of the two (model/roofline.py). Loader settings + compute settings measurements, not
their product: the compute settings screened (model/screening.py) and interleaved, the loaders
one at a time, the training set on the device first (no DataLoader where its gather far outpaces
every step), then fewest workers first, stopping once one with workers outpaces every step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.probe import rates
from autotune.probe.model import roofline, screening
from autotune.search.space import loader_of
from autotune.train.config import TrialConfig
from autotune.train.measure import threads_for

ENOUGH_MARGIN = 1.1  # a loader this many times the fastest step's rate needs no more workers


def queue_stays_full(prediction: roofline.Prediction) -> bool:
    """Whether a setting is held by its step with its loader workers well ahead: their queue stays
    full, so an end-to-end window need not hold several of their bursts."""
    return prediction.overlapped and (
        prediction.loader_rate >= ENOUGH_MARGIN * prediction.compute_rate
    )


def predicted(
    measured: Callable[..., dict[str, rates.Rate]],
    loaders: list[dict[str, Any]],
    computes: list[dict[str, Any]],
    config: Callable[[dict[str, Any]], TrialConfig],
    *,
    on_cpu: bool,
    bar: Any,
) -> tuple[list[roofline.Prediction], dict[str, Any]]:
    """Every loader setting's rate and every compute setting's, measured apart, and each pair's
    predicted speed, fastest first; the rates as the outcome's figures."""
    # On a CPU the loader's workers take cores from the step: its rate is measured once for each
    # thread count the loader settings leave it (recipe.training_threads); a GPU's step runs alike.
    threads = {s["num_workers"]: threads_for(s["num_workers"] if on_cpu else 0) for s in loaders}
    # a thread count -> the fewest workers leaving it
    workers_for = {t: w for w, t in sorted(threads.items(), reverse=True)}
    keyed = {
        f"{i}@{t}": (c, w) for i, c in enumerate(computes) for t, w in sorted(workers_for.items())
    }
    compute_rates: dict[str, rates.Rate] = {}

    def measure_stage(indices: list[int]) -> dict[int, float | None]:
        """Each stage's settings in one process (each another CUDA context and task to load:
        seconds on a GPU host), at every thread count; their rates at the most threads."""
        stage = {k: v for k, v in keyed.items() if int(k.partition("@")[0]) in indices}
        compute_rates.update(
            measured(
                rates.measure_in_groups,
                {k: config({**c, "num_workers": w}) for k, (c, w) in stage.items()},
                rates.COMPUTE_GROUP,
            )
        )
        bar.update(len(stage))
        return {i: compute_rates[f"{i}@{max(workers_for)}"].samples_per_second for i in indices}

    screening.screened(computes, measure_stage)
    keyed = {k: v for k, v in keyed.items() if k in compute_rates}
    fastest_step = max((r.samples_per_second or 0.0 for r in compute_rates.values()), default=0.0)
    # a loader this much faster than every step leaves more workers nothing to feed
    enough = ENOUGH_MARGIN * fastest_step if fastest_step else None
    loader_rates: dict[str, rates.Rate] = {}

    def measure_loaders(indices: list[int]) -> dict[int, float | None]:
        these = {str(i): config({**computes[0], **loaders[i]}) for i in indices}
        loader_rates.update(measured(rates.measure_loaders_in_turn, these, enough))
        bar.update(len(indices))
        return {i: loader_rates[str(i)].samples_per_second for i in indices}

    screening.screened_loaders(loaders, measure_loaders, fastest_step=fastest_step)
    ran = [(str(i), s) for i, s in enumerate(loaders) if str(i) in loader_rates]
    gathers = [
        loader_rates[i].samples_per_second or 0.0 for i, s in ran if loader_of(s)["data_on_device"]
    ]
    outpaced = len(ran) < len(loaders) and screening.outpaced_by_gather(gathers, fastest_step)

    def compute_rate(loader: dict[str, Any], compute: dict[str, Any]) -> float | None:
        return compute_rates[
            f"{computes.index(compute)}@{threads[loader['num_workers']]}"
        ].samples_per_second

    predictions = roofline.predict(
        [(s, loader_rates[i].samples_per_second) for i, s in ran],
        [c for i, c in enumerate(computes) if f"{i}@{max(workers_for)}" in compute_rates],
        compute_rate,
    )
    figures = {
        "loader_rates": [{**s, **loader_rates[i].as_json()} for i, s in ran],
        "compute_rates": [
            {**c, "threads": int(k.partition("@")[2]), **compute_rates[k].as_json()}
            for k, (c, _) in keyed.items()
        ],
        **({"screened_from": len(computes)} if len(computes) > screening.SCREEN_ABOVE else {}),
        # no DataLoader measured: the gather on the device left one nothing to gain
        **({"gather_outpaced": {"gather": max(gathers), "step": fastest_step}} if outpaced else {}),
    }
    return predictions, figures
