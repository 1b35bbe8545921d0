"""autotune.record.definition: what changed in a study's definition, and which changes one study
cannot hold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.record import definition
from autotune.search.space import Choices, Range
from autotune.spec.study_file import load

HEAD = "task: digits\ntarget: {metric: accuracy, value: 0.97}\n"


def describe(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "study.yaml"
    path.write_text(HEAD + text)
    spec = load(path)
    return definition.for_spec(spec, space=spec.space, device="cpu")


def test_a_study_without_params_has_no_params_in_its_definition(tmp_path: Path) -> None:
    """So that studies begun before parameters existed still match their stored definition."""
    assert "params" not in describe(tmp_path, "")


def test_param_changes_are_listed_and_new_choices_cannot_mix(tmp_path: Path) -> None:
    old = describe(tmp_path, "space: {params: {width: {low: 8, high: 32}, kind: [sgd, adamw]}}\n")
    wider = describe(tmp_path, "space: {params: {width: {low: 8, high: 64}, kind: [sgd, adamw]}}\n")
    assert definition.changes(old, wider) == ["params.width.high: 32 -> 64"]
    assert definition.unmixable(old, wider) == []  # a wider range is the same kind of parameter

    other_choices = describe(
        tmp_path, "space: {params: {width: {low: 8, high: 32}, kind: [sgd, adam]}}\n"
    )
    assert definition.changes(old, other_choices) == [
        'params.kind: ["sgd", "adamw"] -> ["sgd", "adam"]'
    ]
    assert definition.unmixable(old, other_choices) == ["params.kind"]

    added = describe(
        tmp_path,
        "space: {params: {width: {low: 8, high: 32}, kind: [sgd, adamw], depth: [2, 3]}}\n",
    )
    assert definition.changes(old, added) == ["params.depth: (none) -> [2, 3]"]
    assert definition.unmixable(old, added) == []  # a new parameter: old trials simply lack it


def test_the_definition_reads_params_from_the_space_it_is_given(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(HEAD)
    spec = load(path)
    space = dataclasses.replace(
        spec.space, params=(("width", Range(8, 16)), ("act", Choices(("relu",))))
    )
    assert definition.for_spec(spec, space=space, device="cpu")["params"] == {
        "width": {"low": 8, "high": 16, "log": False},
        "act": ["relu"],
    }


def test_a_study_begun_before_the_systems_knobs_goes_on_without_them(tmp_path: Path) -> None:
    """A stored definition that lacks channels_last, compile and cudnn_benchmark (a study begun
    before they were knobs) is resumed with them fixed off, one notice each, and no change to
    refuse; a new study searches them."""
    import optuna

    from autotune.study import preparation, run_plan

    path = tmp_path / "study.yaml"
    path.write_text(HEAD + "device: cpu\n")
    spec = load(path)
    fresh = preparation.prepare(spec)
    assert fresh.space["channels_last"] == Choices((False, True))  # searched in a new study
    old = {
        **fresh.definition,
        "space": {k: v for k, v in fresh.definition["space"].items() if k != "channels_last"},
    }
    stored = optuna.create_study(study_name=spec.name, storage=spec.storage)
    stored.set_user_attr("definition", old)

    resumed = run_plan.as_begun(spec, preparation.prepare(spec), stored)
    assert resumed.space["channels_last"] == Choices((False,))
    assert any(
        n.startswith("channels_last fixed to false: study 'study' began before")
        for n in resumed.notices
    )
    assert resumed.definition == old
    assert run_plan.check_unchanged(spec, resumed, stored, allow_changes=False) == []
