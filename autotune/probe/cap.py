"""The systems probe's time cap: past it no measurement starts, and the probe keeps what it
measured."""

from __future__ import annotations

import math
import os

from autotune.errors import AutotuneError
from autotune.spec.study_file import StudySpec

# The cap: this share of the trials' budget (trials x max_seconds), within PROBE_SECONDS' bounds,
# and at most this share of budget.timeout where one is set.
PROBE_SHARE = 0.25
PROBE_SECONDS = (30.0, 120.0)
PROBE_SECONDS_ENV = "AUTOTUNE_PROBE_SECONDS"


def probe_cap(spec: StudySpec) -> float:
    """Seconds the systems probe may measure for: PROBE_SHARE of what the trials may train, within
    PROBE_SECONDS, and never more than PROBE_SHARE of the run's timeout; AUTOTUNE_PROBE_SECONDS,
    where set, in place of all that."""
    given = os.environ.get(PROBE_SECONDS_ENV)
    if given is not None:
        try:
            seconds = float(given)
        except ValueError:
            seconds = math.nan
        if not seconds > 0 or math.isinf(seconds):
            raise AutotuneError(
                f"{PROBE_SECONDS_ENV}: got {given!r}; a number of seconds above 0, e.g. 120"
            )
        return seconds
    low, high = PROBE_SECONDS
    cap = min(max(PROBE_SHARE * spec.budget.trials * spec.budget.max_seconds, low), high)
    if spec.budget.timeout is not None:
        cap = min(cap, PROBE_SHARE * spec.budget.timeout)
    return cap
