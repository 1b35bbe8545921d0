"""Which parameters mattered for time to target: Optuna's importance evaluator over the study."""

from __future__ import annotations

import random
import warnings

import optuna

MIN_TRIALS = 3  # complete trials below which an importance is noise
# fANOVA's forest grows faster than its trials (5,000 trials: over a minute); past this many, a
# seeded sample of them, whose ranking of the parameters is the same to within its noise
MAX_TRIALS = 500


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
            values = optuna.importance.get_param_importances(
                _sampled(study, complete), evaluator=evaluator
            )
    # one plot of the report: whatever Optuna objects to, the rest is still drawn
    except Exception as exc:
        return None, f"Optuna could not evaluate importances ({exc.__class__.__name__}: {exc})"
    if not values:
        return None, "no parameter varies across the complete trials"
    return dict(values), ""


def sampled_from(complete: int) -> int:
    """How many of `complete` trials the importances are computed over."""
    return min(complete, MAX_TRIALS)


def _sampled(study: optuna.Study, complete: list[optuna.trial.FrozenTrial]) -> optuna.Study:
    """The study, or past MAX_TRIALS complete trials an in-memory one holding a seeded sample."""
    if len(complete) <= MAX_TRIALS:
        return study
    sample = random.Random(0).sample(complete, MAX_TRIALS)
    said = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory"
    try:
        copy = optuna.create_study(directions=study.directions)
    finally:
        optuna.logging.set_verbosity(said)
    copy.add_trials(sorted(sample, key=lambda t: t.number))
    return copy
