"""What runs a study's training under each isolation mode (`isolation`: process, warm, none): its
trials, and the measurements of its systems probe."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from autotune.runners import isolation, warm
from autotune.train.tasks import Task

# A measurement (a stage of the systems probe) may take this many
# trials' wall-clock limit before it is killed as hung.
MEASURE_HANG_FACTOR = 4


@dataclasses.dataclass(frozen=True)
class Runners:
    """A study's runners. `end_measuring` is called once the systems are measured, before the
    first trial."""

    run_trial: isolation.RunTrial  # the study's trials and its confirmation
    measure: isolation.Measure  # the systems probe's measurements
    end_measuring: Callable[[], None]


def for_mode(
    mode: str,
    task_name: str,
    task: Task,
    *,
    study_path: Path,
    trial_timeout: float,
    notice: Callable[[str], None] | None = None,
) -> Runners:
    """The runners of `mode` for the task `task_name` (built here as `task`)."""

    def kept(notice: Callable[[str], None] | None) -> warm.WarmChild:
        return warm.WarmChild(
            task_name,
            study_path=study_path,
            hang_after=trial_timeout,
            measure_hang_after=MEASURE_HANG_FACTOR * trial_timeout,
            notice=notice,
        )

    if mode == "process":
        # Each trial in a fresh child. The measurements share one child, ended before the first
        # trial: a fresh one each would pay the CUDA context, the task's data and the first
        # steps again (2.7 s on an H100) for each of a probe's 8 or more, none of which is a
        # trial whose memory must go back before the next. Replacing it is no news to a user.
        measuring = kept(notice=None)
        fresh = isolation.in_child(task_name, study_path=study_path, hang_after=trial_timeout)
        return Runners(fresh, measuring.measure, measuring.close)
    if mode == "warm":
        # Its child is replaced once the systems are measured, as the process mode's is: what the
        # measurements left in it (cuDNN's algorithms, compiled kernels) is no trial's to find.
        trials = kept(notice)
        return Runners(trials.run_trial, trials.measure, trials.close)
    run_trial = isolation.in_process(task)
    return Runners(run_trial, isolation.measure_in_process(task), _nothing)


def _nothing() -> None:
    return None
