"""The goodput table in a study: stored once from the probe's figures, so a resumed study and
every worker time their trials by the same one, and read back into the plan the trials follow
(probe/plan.py holds what the table plans, without Optuna)."""

from __future__ import annotations

import optuna

from autotune import progress
from autotune.probe.model import goodput
from autotune.probe.plan import GoodputSettings, baseline_space, from_probe, restrict
from autotune.record import schema
from autotune.search.space import Space
from autotune.spec.study_file import GOODPUT, SYSTEMS_ONLY, StudySpec
from autotune.storage import opening
from autotune.study.preparation import Prepared


def due(spec: StudySpec, study: optuna.Study) -> bool:
    """Whether the study's objective times its trials by a table it has not stored yet."""
    return spec.objective in (GOODPUT, SYSTEMS_ONLY) and schema.throughput(study.user_attrs) is None


def ensure_table(spec: StudySpec, prepared: Prepared, study: optuna.Study) -> None:
    """The table once per study (a resumed one keeps its own), stored, from the probe's figures;
    where the probe measured none, one line on what the trials do instead."""
    if not due(spec, study):
        return
    stored = schema.probe(study.user_attrs)
    table = from_probe(stored, batch_norm=prepared.batch_norm) if stored else None
    if table is None:
        why = (stored or {}).get("unsettled") or "it did not run"
        instead = (
            "the baseline's setting alone is trained"
            if spec.objective == SYSTEMS_ONLY
            else "each trial is timed by its own clock"
        )
        progress.say(
            f"autotune: the probe measured no table for {spec.objective} ({why}): {instead}"
        )
        return
    if schema.throughput(study.user_attrs) is not None:  # a run on another machine's
        progress.say(opening.FIRST_STORED.format(what="throughput table"))
        return
    schema.record_throughput(study, table)
    # the report repeats it, so quiet hides it
    progress.tell(f"autotune: {goodput.describe(table)}")


def plan_for(
    spec: StudySpec, prepared: Prepared, study: optuna.Study, space: Space
) -> tuple[GoodputSettings | None, Space]:
    """The plan the trials follow and the space they sample; no plan outside goodput."""
    if spec.objective not in (GOODPUT, SYSTEMS_ONLY):
        return None, space
    stored = schema.throughput(study.user_attrs)
    if stored is None:  # the probe measured none: trials on their own clocks
        return None, baseline_space(
            space, prepared.baseline
        ) if spec.objective == SYSTEMS_ONLY else space
    table = goodput.Table.from_json(stored["table"])
    # the split of an effective batch may use any of the space's micro-batches
    plan = GoodputSettings(table, space)
    sampled = (
        baseline_space(space, prepared.baseline)
        if spec.objective == SYSTEMS_ONLY
        else restrict(space, table)
    )
    return plan, sampled
