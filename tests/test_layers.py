"""The layers keep to their rules: spec and search load neither torch nor Optuna, train never
Optuna, only the study layer writes to Optuna, and a study's attributes are read and written by
key only in the schema module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
SCHEMA = PACKAGE / "study" / "schema.py"


def modules(layer: str) -> list[str]:
    folder = PACKAGE / layer
    return sorted(
        "autotune."
        + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        for p in folder.rglob("*.py")
    )


def loaded_by(names: list[str]) -> set[str]:
    """Top-level packages a fresh interpreter has loaded after importing `names`."""
    code = (
        f"import importlib, sys\nfor n in {names!r}: importlib.import_module(n)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("spec", {"torch", "optuna"}),
        ("search", {"torch", "optuna"}),
        ("train", {"optuna"}),
        (
            "export",
            {"torch", "optuna"},
        ),  # an export is text: it reads the recipe, never builds the objects
    ],
)
def test_a_layer_does_not_load(layer: str, forbidden: set[str]) -> None:
    assert not loaded_by(modules(layer)) & forbidden


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_study_layer_and_the_report_import_optuna() -> None:
    """The study layer writes to Optuna; the report reads importances through it; nobody else."""
    allowed = {PACKAGE / "study", PACKAGE / "report" / "importance.py", PACKAGE / "cli.py"}
    users = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if any(i.split(".")[0] == "optuna" for i in imports(p))
        and not any(p == a or a in p.parents for a in allowed)
    }
    assert users == set()


WRITES = {"set_user_attr", "set_system_attr", "set_trial_user_attr", "set_trial_system_attr"}
ATTRS = {"user_attrs", "system_attrs"}


def by_key(tree: ast.AST) -> list[int]:
    """Lines that write a study or trial attribute, or read one by its key (`attrs[...]`,
    `attrs.get(...)`, `... in attrs`), rather than passing the attributes on whole."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in ATTRS
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "get"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in ATTRS
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(
            isinstance(c, ast.Attribute) and c.attr in ATTRS for c in node.comparators
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_stored_attributes_are_read_and_written_by_key_only_in_the_schema() -> None:
    found = {
        f"{p.relative_to(PACKAGE)}:{line}"
        for p in PACKAGE.rglob("*.py")
        if p != SCHEMA
        for line in by_key(ast.parse(p.read_text()))
    }
    assert found == set()


def test_the_rule_finds_a_read_by_key() -> None:
    """The check above would see each way of reaching past the schema."""
    code = (
        "t.set_user_attr('k', 1)\nx = t.user_attrs['k']\ny = t.system_attrs.get('k')\n"
        "z = 'k' in t.user_attrs\nschema.config(t.user_attrs)\n"
    )
    assert by_key(ast.parse(code)) == [1, 2, 3, 4]


def test_no_module_is_much_over_300_lines() -> None:
    long = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 320
    }
    assert long == {}
