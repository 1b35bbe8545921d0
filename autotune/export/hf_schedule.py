"""The LR schedule and its length as transformers.TrainingArguments takes them, for `--format hf`.

TrainingArguments names a schedule (lr_scheduler_type, warmup_steps) and a length in epochs.
Where autotune's schedule has no such name (step) or only a near one (onecycle), the note gives
the code that builds it exactly, in a Trainer subclass's create_scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.export.common import (
    APPROXIMATION,
    NO_EQUIVALENT,
    ONECYCLE,
    Part,
    lookup,
    note,
    pct_start_code,
    scheduler_code,
)
from autotune.search.recipe import ONECYCLE_PCT_START

# lr_scheduler_type and warmup_steps (a fraction of the steps) per scheduler; None: no equivalent.
SCHEDULERS = {
    "constant": ("constant", 0),
    "cosine": ("cosine", 0),
    "onecycle": ("cosine", ONECYCLE_PCT_START),
    "step": None,
}
CREATE_SCHEDULER = (
    "subclass transformers.Trainer and override "
    "create_scheduler(self, num_training_steps, optimizer=None) "
    "to set and return self.lr_scheduler = {}"
)


def lr_schedule(knobs: Mapping[str, Any]) -> Part:
    """lr_scheduler_type and warmup_steps for the scheduler knob, and a note where they fall
    short of autotune's schedule."""
    lr = knobs["lr"]
    args: dict[str, Any] = {}
    notes: list[dict[str, Any]] = []
    schedule = lookup("hf", "scheduler", knobs["scheduler"], SCHEDULERS)
    exact = CREATE_SCHEDULER.format(
        scheduler_code(
            knobs["scheduler"],
            optimizer="optimizer or self.optimizer",
            total="num_training_steps",
            lr=repr(lr),
        )
    )
    if schedule is None:
        notes.append(
            note(
                "scheduler",
                "step",
                NO_EQUIVALENT,
                "TrainingArguments has no multi-step schedule "
                "(lr x0.1 at 1/2 and x0.01 at 3/4 of the optimizer steps: MultiStepLR, gamma 0.1), "
                "so lr_scheduler_type is left out and HF's default (linear decay) would apply. "
                f"To train as autotune did, {exact}.",
            )
        )
    else:
        args["lr_scheduler_type"], args["warmup_steps"] = schedule
    if knobs["scheduler"] == "onecycle":
        notes.append(_onecycle_note(lr, exact))
    return args, notes


def schedule_length(knobs: Mapping[str, Any], epochs: float | int | None) -> Part:
    """The schedule's length (num_train_epochs), and how accumulation meets the epoch's end."""
    accumulation = knobs["accumulation_steps"]
    args: dict[str, Any] = {}
    notes: list[dict[str, Any]] = []
    if epochs is None:
        notes.append(
            note(
                "max_epochs",
                None,
                NO_EQUIVALENT,
                "the study did not record max_epochs (the length of the LR "
                "schedule); set num_train_epochs to it.",
            )
        )
    else:
        # the schedule's length; HF takes a fraction of an epoch too
        args["num_train_epochs"] = epochs
    if accumulation > 1:
        notes.append(
            note(
                "accumulation_steps",
                accumulation,
                APPROXIMATION,
                f"HF ends every epoch with an optimizer step over the micro-batches left "
                f"(fewer than {accumulation} when len(train_dataloader) is not a multiple of "
                f"{accumulation}) "
                f"and takes ceil(num_train_epochs * ceil(len / {accumulation})) steps; "
                f"autotune lets an effective batch span the epoch boundary: "
                f"floor(max_epochs * len / {accumulation}) steps.",
            )
        )
    return args, notes


def _onecycle_note(lr: float, exact: str) -> dict[str, Any]:
    """How HF's cosine schedule with warm-up differs from autotune's OneCycleLR, and `exact`,
    what builds the latter."""
    return note(
        "scheduler",
        "onecycle",
        APPROXIMATION,
        f"approximated by lr_scheduler_type cosine with warmup_steps {ONECYCLE_PCT_START} "
        f"(transformers 4.x: warmup_ratio={ONECYCLE_PCT_START}). "
        f"It differs from autotune's OneCycleLR(max_lr={lr!r}, "
        f"pct_start={pct_start_code('steps')}): "
        "HF warms up linearly from 0 (OneCycle: a cosine rise from lr/25) "
        "and anneals to 0 (OneCycle: to lr/25/1e4), "
        "and keeps the optimizer's momentum fixed "
        "(OneCycle cycles it between 0.95 and 0.85, against the lr). "
        f"{ONECYCLE}. Exact: {exact}.",
    )
