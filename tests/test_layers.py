"""The layers keep to their rules: spec, search and the probe's model load neither torch nor
Optuna, search imports nothing of the layers above it, train and the probe never Optuna, the probe
nothing of the layers above it, the storage never torch and nothing of the run sequence, the probe
or training, record (what a study means) and the report and exports that stand on it never torch
and of the probe only its model, only the study, storage and record layers import Optuna, and a
study's attributes are read and written by key only in the schema module.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
SCHEMA = PACKAGE / "record" / "schema.py"


def modules(layer: str) -> list[str]:
    """The modules under `layer`, a folder of the package ("train", or "probe/model")."""
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
        ("probe", {"optuna"}),
        ("probe/model", {"torch", "optuna"}),
        # the commands that read a study open it through the storage
        ("storage", {"torch"}),
        # an export is text: it reads the recipe and names the objects, never builds them
        ("export", {"torch", "optuna"}),
        ("record", {"torch"}),
        ("report", {"torch"}),
    ],
)
def test_a_layer_does_not_load(layer: str, forbidden: set[str]) -> None:
    assert not loaded_by(modules(layer)) & forbidden


# What the layers that read a study may import of autotune: what a study means and how it was
# specified, and the probe's model (its stored outcome read back), never the machinery that ran it.
READERS = {
    "record": {"record", "spec", "search", "errors", "probe.model"},
    "report": {"report", "record", "spec", "search", "errors", "probe.model"},
    "export": {"export", "record", "spec", "search", "errors", "probe.model"},
}
# Folders whose parts the rules tell apart: of the probe, a reader may import the model alone.
SPLIT = {"probe"}


def part(name: str) -> str:
    """The part of autotune a module `autotune.x.y...` belongs to: `x`, or `x.y` where x is
    split (autotune.probe.model.text -> probe.model; autotune.probe.run -> probe.run)."""
    names = name.split(".")[1:]
    return ".".join(names[:2]) if names[0] in SPLIT else names[0]


@pytest.mark.parametrize("layer", sorted(READERS))
def test_reading_a_study_needs_no_training_machinery(layer: str) -> None:
    """Imports under TYPE_CHECKING are annotations only, and are not counted."""
    reached = {
        f"{p.relative_to(PACKAGE)}: {name}"
        for p in (PACKAGE / layer).rglob("*.py")
        for name in runtime_imports(p)
        if name.startswith("autotune.") and part(name) not in READERS[layer]
    }
    assert reached == set()


def test_a_reader_may_import_the_probe_s_model_and_nothing_else_of_the_probe() -> None:
    assert part("autotune.probe.model.outcome") in READERS["report"]
    assert part("autotune.probe.model") in READERS["report"]
    assert part("autotune.probe.run") not in READERS["report"]
    assert part("autotune.probe") not in READERS["report"]
    assert part("autotune.search.space") == "search"


# What the probe may not import: the layers above it, which run it or read what it stored.
ABOVE_THE_PROBE = {"study", "report", "export", "cli", "api"}
# What the storage may not import: the run sequence, the machinery that trains and measures, and
# the layers that read a study through it.
ABOVE_THE_STORAGE = {"study", "probe", "runners", "train", "report", "export", "cli", "api"}


def reaches_into(path: Path, layers: set[str]) -> set[str]:
    """The modules of `layers` (autotune's folders or top-level modules) that `path` imports at
    run time."""
    return {
        name
        for name in runtime_imports(path)
        if name.startswith("autotune.") and name.split(".")[1] in layers
    }


def test_the_probe_imports_nothing_of_the_layers_above_it() -> None:
    """The study passes the probe what it reads (probe/measuring.py), and imports it; the probe
    never imports the study."""
    reached = {
        f"{p.relative_to(PACKAGE)}: {name}"
        for p in (PACKAGE / "probe").rglob("*.py")
        for name in reaches_into(p, ABOVE_THE_PROBE)
    }
    assert reached == set()


def test_the_storage_imports_nothing_of_the_run_sequence_or_the_machinery() -> None:
    """The study imports the storage; the storage never imports the study, the probe, the runners
    or training, so a command that reads a study opens it without them."""
    reached = {
        f"{p.relative_to(PACKAGE)}: {name}"
        for p in (PACKAGE / "storage").rglob("*.py")
        for name in reaches_into(p, ABOVE_THE_STORAGE)
    }
    assert reached == set()


# search is the lowest layer: what a study searches, read by every layer above it.
ABOVE_THE_SEARCH = {
    "spec",
    "probe",
    "storage",
    "study",
    "runners",
    "train",
    "record",
    "report",
    "export",
    "cli",
    "api",
}


def test_the_search_imports_nothing_of_the_layers_above_it() -> None:
    """The prior and the micro-batch rule the probe measures at live in search/ and read only the
    space: search never imports the probe, the study or the readers."""
    reached = {
        f"{p.relative_to(PACKAGE)}: {name}"
        for p in (PACKAGE / "search").rglob("*.py")
        for name in reaches_into(p, ABOVE_THE_SEARCH)
    }
    assert reached == set()


def test_the_upward_rules_find_a_reach_upward(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom autotune.study.preparation import Prepared\n"
        "import autotune.api\nfrom autotune.train import rates\n"
        "if TYPE_CHECKING:\n    from autotune.report.text import describe\n"
    )
    assert reaches_into(module, ABOVE_THE_PROBE) == {"autotune.study.preparation", "autotune.api"}
    assert reaches_into(module, ABOVE_THE_STORAGE) == {
        "autotune.study.preparation",
        "autotune.api",
        "autotune.train",
    }


def runtime_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for n in ast.walk(node)
    }
    names = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_reading_rule_finds_a_reach_into_the_machinery(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nfrom autotune.study import run\n"
        "if TYPE_CHECKING:\n    from autotune.train.config import TrialResult\n"
    )
    assert runtime_imports(module) == {"typing", "autotune.study"}


# The commands that read a study, run where torch cannot be imported at all.
NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"{name} is made unimportable for this test")
sys.meta_path.insert(0, NoTorch())
sys.argv = ["autotune", *sys.argv[1:]]
from autotune.cli import main
sys.exit(main())
"""


COMMANDS = [
    ["report", "{study}"],
    ["report", "{study}", "--json"],
    ["report", "{study}", "--html", "{tmp}/report.html", "--csv", "{tmp}/trials.csv"],
    ["report", "{study}", "--tensorboard", "{tmp}/curves"],
    *(["export", "{study}", "--format", f] for f in ("torch", "lightning", "hf", "args", "yaml")),
    ["export", "--storage", "sqlite:///{tmp}/small.db", "--study", "small", "--format", "json"],
]

# Every command above in one interpreter behind the blocker (one start, not ten): torch is never
# in sys.modules there, so a command that reached for it fails however many ran before it. Each
# runs in a folder of its own, with its own copy of the study, and its exit status and output
# are kept apart.
EACH = """
import contextlib, io, json, os
results = []
for folder, args in json.loads(sys.argv[1]):
    os.chdir(folder)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    results.append((code, out.getvalue(), err.getvalue()))
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def without_torch(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, str, str, Path]]:
    """Each of COMMANDS run where torch cannot be imported: exit status, stdout, stderr, folder."""
    stored = Path(__file__).resolve().parent / "data" / "stored_study"
    runs = []
    for i, command in enumerate(COMMANDS):
        tmp = tmp_path_factory.mktemp(f"command{i}")
        shutil.copy(stored / "small.db", tmp / "small.db")
        (tmp / "small.yaml").write_text((stored / "small.yaml").read_text())
        runs.append((str(tmp), [a.format(study=tmp / "small.yaml", tmp=tmp) for a in command]))
    code = NO_TORCH.split("sys.argv =")[0] + "from autotune.cli import main\n" + EACH
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(runs)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return [(*result, Path(folder)) for result, (folder, _) in zip(json.loads(done.stdout), runs)]


@pytest.mark.parametrize(
    "index", range(len(COMMANDS)), ids=[" ".join(a for a in c if "{" not in a) for c in COMMANDS]
)
def test_report_and_export_run_where_torch_cannot_be_imported(
    index: int, without_torch: list[tuple[int, str, str, Path]]
) -> None:
    code, out, err, folder = without_torch[index]
    assert code == 0, err
    assert out or (folder / "report.html").exists()


def test_the_blocker_makes_torch_unimportable() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_TORCH.split("sys.argv")[0] + "import torch"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "torch is made unimportable" in done.stderr


def test_only_the_study_storage_and_record_layers_import_optuna() -> None:
    """The study layer writes a run to Optuna; the storage opens, creates and recovers the study
    in it; record reads the storage through it; nobody else (an annotation under TYPE_CHECKING
    loads nothing, and is not counted)."""
    allowed = {PACKAGE / "study", PACKAGE / "storage", PACKAGE / "record", PACKAGE / "cli.py"}
    users = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if any(i.split(".")[0] == "optuna" for i in runtime_imports(p))
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
