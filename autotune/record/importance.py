"""Which parameters mattered for time to target: Optuna's importance evaluator over the study."""

from __future__ import annotations

import warnings

import optuna

MIN_TRIALS = 3  # complete trials below which an importance is noise


def param_importances(study: optuna.Study) -> tuple[dict[str, float] | None, str]:
    """Importances of the parameters for the study's value (Optuna's default evaluator, fANOVA, over
    the complete trials, feasible or not), largest first; or None and why there are none."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < MIN_TRIALS:
        return None, f"needs at least {MIN_TRIALS} complete trials; the study has {len(complete)}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature and constant-parameter warnings
            # the same figures every time
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            values = optuna.importance.get_param_importances(study, evaluator=evaluator)
    # one plot of the report: whatever Optuna objects to, the rest is still drawn
    except Exception as exc:
        return None, f"Optuna could not evaluate importances ({exc.__class__.__name__}: {exc})"
    if not values:
        return None, "no parameter varies across the complete trials"
    return dict(values), ""
