"""What the export formats share: the knobs apart from the user's parameters, what autotune's
trial builds from them (the recipe's optimizer and LR schedules, the latter as code), notes for
what a trainer cannot take, provenance.

Rule: where a trainer has no equivalent for a setting, the export says so in a note naming the
setting, its value, why and what to do, never by dropping it. Notes live in their own key (or in
comments), so every section stays ready to splat.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from autotune.errors import AutotuneError
from autotune.record.derived import current_reference
from autotune.record.summary import Summary, counted, speedup_phrase
from autotune.search import recipe
from autotune.search.knob import DDP_NAMES
from autotune.search.recipe import Schedule
from autotune.search.space import KNOBS, SCHEDULE, filled

# What the OneCycle schedule's code does beyond OneCycleLR's defaults (recipe.schedule_for,
# onecycle_pct_start).
ONECYCLE = (
    f"OneCycleLR warms up over {recipe.ONECYCLE_PCT_START:.0%} of the optimizer steps but at least "
    f"{recipe.ONECYCLE_MIN_WARMUP_STEPS} (it divides by the warm-up's steps less one); "
    f"a run of fewer than {recipe.SCHEDULES['onecycle'].min_steps} steps keeps the peak lr"
)

# Statuses of a note: the setting is in another section; carried only approximately; not carried.
MOVED, APPROXIMATION, NO_EQUIVALENT = "moved", "approximation", "no equivalent"
# A trainer's keyword arguments (or one section's), and the notes for them.
Part = tuple[dict[str, Any], list[dict[str, Any]]]


def note(setting: str, value: Any, status: str, text: str) -> dict[str, Any]:
    return {"setting": setting, "value": value, "status": status, "note": text}


def settings(summary: Summary) -> dict[str, Any]:
    """The winner's settings: its knobs in KNOBS order, then the user's own parameters.

    A study stored before a knob existed has no value for it (or None, which a trial record holds
    for a knob its trial lacked), and its trials ran without it: such a knob takes what leaving it
    out meant, KNOBS[name].absent, in every format. A knob without one stays as stored, or missing.
    DistributedDataParallel's knobs are written only for a winner trained on several devices: on
    one, DDP never ran, and a script's argparse need not know them.
    """
    params = summary.best.params
    # an objective function's study: the knobs it reads
    read = KNOBS if summary.knobs is None else summary.knobs
    full = filled(params)
    knobs = {
        name: full[name]
        for name, knob in KNOBS.items()
        if name in read and (name in params or knob.absent is not None) and name in written(summary)
    }
    return {**knobs, **{k: v for k, v in params.items() if k not in KNOBS}}


def written(summary: Summary) -> tuple[str, ...]:
    """The knobs an export writes, in KNOBS order: DDP's only for several devices (`settings`)."""
    several = summary.devices_per_trial != 1
    return tuple(k for k in KNOBS if several or k not in DDP_NAMES)


def knobs_and_params(summary: Summary) -> tuple[dict[str, Any], dict[str, Any]]:
    """The winner's knobs but the schedule's length (`max_epochs`), and the user's own parameters
    (every other key), in order."""
    if summary.knobs is not None:
        raise AutotuneError(
            f"study {summary.study!r} tuned a training (a command or an objective function) "
            f"that reads only {', '.join(summary.knobs) or 'its own parameters'} of autotune's "
            f"knobs, not a training autotune could write out for a trainer: "
            f"--format json, yaml, args or command give what it tuned"
        )
    values = settings(summary)
    # nothing can stand in for these
    missing = [k for k in written(summary) if k not in values and k != SCHEDULE]
    if missing:
        raise AutotuneError(
            f"the winner's settings lack {', '.join(missing)}; the study storage looks damaged"
        )
    return {k: values[k] for k in written(summary) if k != SCHEDULE}, {
        k: v for k, v in values.items() if k not in KNOBS
    }


def max_epochs(summary: Summary) -> float | int | None:
    """The length of the winner's LR schedule (its schedule_epochs, else the study's max_epochs):
    an int when whole, None when unknown."""
    value = summary.best.params.get(SCHEDULE) or (summary.limits or {}).get("max_epochs")
    if value is None:
        return None
    return int(value) if float(value).is_integer() else float(value)


def lookup(fmt: str, knob: str, value: Any, table: Mapping[str, Any]) -> Any:
    try:
        return table[value]
    except (KeyError, TypeError):
        raise AutotuneError(
            f"--format {fmt}: {knob} {value!r} has no mapping; it takes one of {', '.join(table)}"
        ) from None


def built_in_optimizer(summary: Summary) -> bool:
    """Whether the study's task trained with autotune's built-in SGD (recipe.SGD_ARGS), by today's
    name or by the one a study stored before the module moved."""
    return current_reference(summary.optimizer) == recipe.BUILT_IN_OPTIMIZER


def scheduler_code(
    name: str, *, optimizer: str, total: str, lr: str, indent: str | None = None
) -> str:
    """A Python expression that builds the LR schedule `name` as the trial does
    (recipe.scheduler_args); `optimizer`, `total` (the run's optimizer steps) and `lr` are
    expressions of the code it goes into. With `indent`, a two-way choice spans two lines."""
    schedule = recipe.SCHEDULES[name]
    code = _schedule_code(schedule, optimizer=optimizer, total=total, lr=lr)
    if schedule.min_steps > 1:  # a shorter run keeps the peak lr (recipe.schedule_for)
        short = _schedule_code(
            recipe.SCHEDULES["constant"], optimizer=optimizer, total=total, lr=lr
        )
        choice = f"if {total} >= {schedule.min_steps} else {short}"
        code = f"{code} {choice}" if indent is None else f"({code}\n{indent} {choice})"
    return code


def pct_start_code(total: str) -> str:
    """recipe.onecycle_pct_start as a Python expression of `total`, the run's optimizer steps."""
    return f"max({recipe.ONECYCLE_PCT_START!r}, {recipe.ONECYCLE_MIN_WARMUP_STEPS!r} / {total})"


def _schedule_code(schedule: Schedule, *, optimizer: str, total: str, lr: str) -> str:
    args = [f"{schedule.peak_lr}={lr}"] if schedule.peak_lr else []
    for arg, fraction in schedule.of_total_steps.items():
        steps = (
            [_steps_code(f, total) for f in fraction]
            if isinstance(fraction, tuple)
            else _steps_code(fraction, total)
        )
        args.append(f"{arg}=[{', '.join(steps)}]" if isinstance(steps, list) else f"{arg}={steps}")
    args += [f"{arg}={value!r}" for arg, value in schedule.init_args.items()]
    if schedule.warmup:
        args.append(f"{schedule.warmup}={pct_start_code(total)}")
    return f"torch.optim.lr_scheduler.{schedule.torch_class}({', '.join([optimizer, *args])})"


def _steps_code(fraction: float, total: str) -> str:
    """recipe.steps as code: `total // 2` for 0.5. A float is a fraction with a power-of-two
    denominator, which a small one multiplies exactly, so `total * n // d` rounds down as
    floor(fraction * total) does."""
    ratio = Fraction(fraction)
    if ratio == 1:
        return total
    if ratio.denominator > 64:
        return f"math.floor({fraction!r} * {total})"
    return (
        f"{total} // {ratio.denominator}"
        if ratio.numerator == 1
        else f"{total} * {ratio.numerator} // {ratio.denominator}"
    )


def threads_note(knobs: Mapping[str, Any]) -> dict[str, Any]:
    return note(
        "num_workers",
        knobs["num_workers"],
        NO_EQUIVALENT,
        "autotune also set torch.set_num_threads(cores - num_workers) in the training process "
        "and one thread in each loader worker (a worker_init_fn calling torch.set_num_threads(1)); "
        "oversubscribed cores slowed small-batch CPU training more than 10x. "
        "Neither fits a keyword argument: do the same in your script.",
    )


def data_on_device_note(knobs: Mapping[str, Any], trainer: str) -> dict[str, Any]:
    """Where the training batches were made: `trainer` batches through a DataLoader, as autotune
    does unless data_on_device."""
    if not knobs["data_on_device"]:
        text = f"autotune loaded the training batches through a DataLoader, as {trainer} does."
    else:
        text = (
            f"{trainer} batches through a DataLoader; autotune kept the training set on the "
            "device and gathered each micro-batch there at once (the task's device_train, or a "
            "TensorDataset's tensors indexed there), the same samples a DataLoader gives, with no "
            "loader workers. To train as it did, copy your training tensors to the device and "
            "give the DataLoader a batch_sampler of index lists and a collate_fn that indexes "
            "them there (num_workers 0, no pinning, as the dataloader settings say)."
        )
    return note("data_on_device", knobs["data_on_device"], NO_EQUIVALENT, text)


def optimizer_note(
    summary: Summary, lr: float, *, trainer: str, then: str, fused: bool = False
) -> dict[str, Any]:
    """The note for a task optimizer other than the built-in SGD, which `trainer` cannot name:
    build it as autotune did (with fused=True where `fused`), `then` (what to do with it)."""
    reference = summary.optimizer
    call = (
        f"(model.parameters(), {lr!r}, **the parameters of yours that it names"
        f"{', fused=True' if fused else ''})"
    )
    if reference is None:
        return note(
            "optimizer",
            None,
            NO_EQUIVALENT,
            f"the study did not record its task's optimizer (a command task builds its own; "
            f"a lambda or local function has no importable name), and {trainer} cannot build it: "
            f"build it as your task did, optimizer = <your optimizer factory>{call}, then {then}.",
        )
    return note(
        "optimizer",
        reference,
        NO_EQUIVALENT,
        f"the task's own optimizer factory, which {trainer} cannot build: "
        f"build it as autotune did, "
        f"optimizer = {current_reference(reference).replace(':', '.')}{call}, then {then}.",
    )


def params_note(params: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    if not params:
        return None
    return note(
        ", ".join(params),
        dict(params),
        MOVED,
        f"your own parameters: {where} has no place for them. They are in `params`; "
        f"autotune passed each by keyword to whichever of the task's model factory and optimizer "
        f"names it: do the same.",
    )


def launcher(summary: Summary, script: str = "train.py") -> str | None:
    """The torchrun line for a winner trained on several devices; None for one device."""
    devices = summary.devices_per_trial
    return None if devices == 1 else f"torchrun --standalone --nproc-per-node={devices} {script}"


def devices_note(summary: Summary) -> list[dict[str, Any]]:
    """What the knobs meant for a winner trained on several devices (none for one)."""
    devices = summary.devices_per_trial
    if devices == 1:
        return []
    return [
        note(
            "devices_per_trial",
            devices,
            MOVED,
            f"the winner trained on {devices} devices, one process each, with "
            "DistributedDataParallel: batch_size is per device, the effective batch is batch_size "
            f"x accumulation_steps x {devices}, and lr is for that effective batch as trained (no "
            f"rescaling). Launch on {devices} devices: {launcher(summary)} ...",
        )
    ]


def provenance(summary: Summary) -> str:
    """Where the winner came from: study, trial, how it was measured, its time and speedup."""
    best, target = summary.best, summary.target
    which = "the baseline" if best.is_baseline else f"trial {best.trial}"
    reached = (
        f"in {best.time_to_target:.3f} s"
        if best.time_to_target is not None
        else f"reached in only {best.reached} of them"
    )
    text = (
        f"autotune study {summary.study}, {which} ({best.source}, {counted(best.runs, 'run')}): "
        f"{target.text} {reached}"
    )
    if best.epochs is not None:
        text += f" after {best.epochs:.2f} epochs"
    if summary.devices_per_trial != 1:
        text += f" on {summary.devices_per_trial} devices"
    if summary.speedup and not best.is_baseline:
        text += f", {speedup_phrase(summary.speedup)} than the baseline"
    if best.is_baseline and summary.confirmation:  # why no configuration of the study's
        text += ". " + summary.confirmation.why_baseline()
    return text
