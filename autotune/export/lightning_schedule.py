"""The LR schedule as a LightningModule's configure_optimizers() returns it, for
`--format lightning`: the `lr_scheduler` section, its note, and the usage lines that build it.

The scheduler's arguments that depend on the run's length are fractions of its optimizer steps
(Lightning's `trainer.estimated_stepping_batches`): autotune steps the schedule once per
optimizer step. OneCycle's warm-up, a function of those steps rather than a fraction, is
computed in `usage`.
"""

from __future__ import annotations

from typing import Any

from autotune.export.common import ONECYCLE, lookup, pct_start_code, scheduler_code
from autotune.search.recipe import SCHEDULES

# configure_optimizers' lines that build the schedule from `lr_scheduler` (recipe.SCHEDULES) over
# the run's optimizer steps; MAKE_SCHEDULER takes the arguments that are not fractions of them.
STEPS_USAGE = [
    "s = export['lr_scheduler']; total = self.trainer.estimated_stepping_batches",
    (
        "steps = {k: [math.floor(f * total) for f in v] if isinstance(v, list) "
        "else math.floor(v * total) "
        "for k, v in s['fractions_of_total_steps'].items()}"
    ),
]
MAKE_SCHEDULER = (
    "getattr(torch.optim.lr_scheduler, s['class_path'].rsplit('.', 1)[1])"
    "(optimizer, **s['init_args'], **steps{})"
)
RETURN_USAGE = (
    "return {'optimizer': optimizer, 'lr_scheduler': {'scheduler': scheduler, **s['config']}}"
)


def scheduler_section(name: str, lr: float) -> tuple[dict[str, Any], str, list[str]]:
    """The `lr_scheduler` section for the scheduler knob `name`, its note, and its usage lines."""
    schedule = lookup("lightning", "scheduler", name, SCHEDULES)
    init_args = (
        {schedule.peak_lr: lr, **schedule.init_args}
        if schedule.peak_lr
        else dict(schedule.init_args)
    )
    section = {
        "class_path": f"torch.optim.lr_scheduler.{schedule.torch_class}",
        "init_args": init_args,
        "fractions_of_total_steps": {
            k: list(v) if isinstance(v, tuple) else v for k, v in schedule.of_total_steps.items()
        },
        "config": {"interval": "step", "frequency": 1},
    }
    text = (
        "lightning.Trainer has no scheduler argument: "
        "`lr_scheduler` holds the torch class autotune used; "
        "return it from configure_optimizers() with interval 'step', "
        "as autotune steps it once per optimizer step. "
        "Arguments that depend on the run's length are fractions of its optimizer steps "
        "(trainer.estimated_stepping_batches), rounded down."
    )
    make = MAKE_SCHEDULER.format("")
    # a function of the run's steps, not a fraction of them: the usage lines compute it
    if schedule.warmup:
        make = MAKE_SCHEDULER.format(f", {schedule.warmup}={pct_start_code('total')}")
        make += (
            f" if total >= {schedule.min_steps} else "
            f"{scheduler_code('constant', optimizer='optimizer', total='total', lr=repr(lr))}"
        )
        text += f" {ONECYCLE}: the usage lines do both."
    return section, text, [*STEPS_USAGE, f"scheduler = {make}", RETURN_USAGE]
