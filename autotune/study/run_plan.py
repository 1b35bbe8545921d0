"""One plan per run, settled once: what every trial and every worker of the run reads.

`preparation.prepare` fits the study file to the device and checks it before the storage is
touched. Against the stored study, the plan then takes the study as it began (knobs it began
without stay out), checks the file is unchanged, and takes the space the stored systems probe
left (and a goodput study's table, its plan). The result is frozen: nothing narrows the space
after it.
"""

from __future__ import annotations

import dataclasses

import optuna

from autotune.errors import AutotuneError
from autotune.probe.model.outcome import restrict
from autotune.probe.plan import GoodputSettings
from autotune.record import definition, schema
from autotune.search.space import KNOBS, Space, absent_domain
from autotune.spec.study_file import StudySpec, options
from autotune.study import goodput_table
from autotune.study.preparation import Prepared


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The run's settled plan."""

    prepared: Prepared  # the task, device, runner and baseline; its space as the study began
    space: Space  # what the trials sample: as begun, then as the probe and the goodput plan left it
    goodput: GoodputSettings | None  # how a goodput trial trains its maths; None otherwise
    # the joint probe's outcome where the trials train at its setting (not under goodput)
    probe: dict | None = None


def settle(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> RunPlan:
    """The plan from what the study stored: its probe's outcome and a goodput study's table."""
    outcome = schema.probe(study.user_attrs)
    return planned(spec, with_probe(spec, prepared, outcome), study, outcome)


def with_probe(spec: StudySpec, prepared: Prepared, outcome: dict | None) -> Prepared:
    """The space as the stored probe's `outcome` settled it; unchanged without one."""
    if spec.probe == "none" or outcome is None:
        return prepared
    return dataclasses.replace(prepared, space=restrict(prepared.space, outcome))


def planned(
    spec: StudySpec, probed: Prepared, study: optuna.Study, outcome: dict | None
) -> RunPlan:
    """The plan of a study whose probe's `outcome` (if any) has settled `probed`: the table
    decides the systems knobs of a goodput study."""
    goodput, space = goodput_table.plan_for(spec, probed, study, probed.space)
    joint = (outcome or {}).get("kind") == "joint" and spec.probe == "joint" and goodput is None
    return RunPlan(prepared=probed, space=space, goodput=goodput, probe=outcome if joint else None)


def as_begun(spec: StudySpec, prepared: Prepared, stored: optuna.Study | None) -> Prepared:
    """`prepared` as the `stored` study began: one begun before a knob existed ran every trial
    without it and goes on so, since one Optuna study cannot add a sampled knob. Adds a notice
    for each knob it fixes."""
    began = (
        (schema.definition(stored.user_attrs) or {}).get("space") if stored is not None else None
    )
    if began is None:
        return prepared
    space, notices = prepared.space, list(prepared.notices)
    for name in KNOBS:
        fixed = absent_domain(name)
        if fixed is not None and name not in began and space[name] != fixed:
            space = space.replace(name, fixed)
            notices.append(
                f"{name} fixed to {str(fixed.values[0]).lower()}: study {spec.name!r} began before "
                f"autotune searched it (give the study a new {options(spec)[0]} to search it)"
            )
    if space is prepared.space:
        return prepared
    return dataclasses.replace(
        prepared,
        space=space,
        notices=notices,
        definition=definition.for_spec(spec, space=space, device=prepared.device.type),
    )


def check_unchanged(
    spec: StudySpec, prepared: Prepared, stored: optuna.Study | None, *, allow_changes: bool
) -> list[str]:
    """The changes to the study's definition since it began; an error unless `allow_changes`.
    Reads `stored` without writing to it, so a refused run leaves it exactly as it was."""
    began = schema.definition(stored.user_attrs) if stored is not None else None
    changed = definition.changes(began, prepared.definition) if began is not None else []
    unmixable = definition.unmixable(began, prepared.definition) if changed else []
    if unmixable:
        raise AutotuneError(_unmixable(spec, changed, unmixable))
    if changed and not allow_changes:
        raise AutotuneError(
            f"{spec.path}: the study file changed since study {spec.name!r} began in "
            f"{spec.storage}: {'; '.join(changed)}. {_stored(stored)}; "
            f"{options(spec)[1]} to add trials under the new ones, or give the study a new "
            f"{options(spec)[0]}"
        )
    return changed


def _stored(study: optuna.Study) -> str:
    """What the stored trials are: measured (they ran), or only queued (the baseline's, before it
    ran)."""
    trials = study.get_trials(deepcopy=False)
    queued = sum(t.state == optuna.trial.TrialState.WAITING for t in trials)
    measured = len(trials) - queued
    if not queued:
        return f"The {measured} trial(s) stored were measured under the old settings"
    if not measured:
        return f"The {queued} trial(s) stored are queued under the old settings, none measured yet"
    return (
        f"Of the {len(trials)} trials stored, {measured} {'was' if measured == 1 else 'were'} "
        f"measured and {queued} {'is' if queued == 1 else 'are'} queued under the old settings"
    )


def _unmixable(spec: StudySpec, changed: list[str], unmixable: list[str]) -> str:
    keys = ", ".join(f"space.{k}" for k in unmixable)
    what = "; ".join(c for c in changed if c.split(":")[0].removeprefix("space.") in unmixable)
    return (
        f"{spec.path}: the choices of {keys} changed since study {spec.name!r} began in "
        f"{spec.storage} ({what}); one Optuna study cannot mix trials over different choices: "
        f"give the study a new {options(spec)[0]} to start afresh"
    )
