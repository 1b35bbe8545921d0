"""The documents' promises: every example runs as written wherever it lives, every link between
them lands, the README stays a page a newcomer reads, and CI runs its test command."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.search.knob import DDP_NAMES
from autotune.search.space import KNOBS

# the knobs a report shows for a study on one device: DDP never ran
ONE_DEVICE = [k for k in KNOBS if k not in DDP_NAMES]

REPO = Path(__file__).resolve().parent.parent
# The README and the documents its reference text lives in; their examples run from any of them.
DOCUMENTS = ("README.md", "docs/reference.md", "docs/measuring.md", "docs/architecture.md")
TEXTS = {name: (REPO / name).read_text() for name in (*DOCUMENTS, "CONTRIBUTING.md")}
README = TEXTS["README.md"]
README_MAX_LINES = 250


def block_after(label: str) -> str:
    """The fenced code block after the line that names `label`, in whichever document holds it:
    exactly one of them does, so no example can shadow another."""
    pattern = rf"`{re.escape(label)}`[^\n]*\n+```\w*\n(.*?)```"
    found = [
        (name, block) for name in DOCUMENTS for block in re.findall(pattern, TEXTS[name], re.S)
    ]
    assert len(found) == 1, f"code blocks after {label}: {len(found)}, in {[n for n, _ in found]}"
    return found[0][1]


def test_the_custom_task_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "my_task.py").write_text(block_after("my_task.py"))
    (tmp_path / "my_study.yaml").write_text(block_after("my_study.yaml"))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "my_study.yaml"]) == 0
    assert "Winner: " in capsys.readouterr().out
    assert main(["report", "my_study.yaml", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    counts = summary["counts"]
    assert (
        counts["complete"] + counts["pruned"] == 6
        and counts["complete"] >= 1
        and (tmp_path / "my_study.db").is_file()
    )
    assert set(summary["best"]["params"]) == set(ONE_DEVICE) and summary["best"]["metric"] >= 0.95


def test_the_params_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("my_task.py", "my_params_task.py", "my_params_study.yaml"):
        (tmp_path / name).write_text(block_after(name))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "my_params_study.yaml"]) == 0
    capsys.readouterr()
    assert main(["report", "my_params_study.yaml", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    params = summary["best"]["params"]
    assert summary["counts"]["complete"] + summary["counts"]["past_incumbent"] == 6 and list(
        params
    ) == [*ONE_DEVICE, "width", "dropout", "weight_decay", "kind"]
    assert 8 <= params["width"] <= 64 and params["kind"] in ("sgd", "adamw")
    # round(sqrt(8 * 64)): the log range's middle
    assert summary["baseline"]["params"]["width"] == 23


def test_the_python_api_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    exec(
        compile(block_after("tune_example.py"), "tune_example.py", "exec"), {"__name__": "__main__"}
    )
    out = capsys.readouterr().out
    assert re.search(r"^model: \{.*'width': (8|32)\}", out, re.M), out
    # what it reads
    assert re.search(r"^loop: \{'lr': [\d.e-]+, 'batch_size': \d+, 'width': \d+\}", out, re.M), out
    assert (tmp_path / "rings.db").is_file() and (tmp_path / "rings_loop.db").is_file()


def test_the_command_task_example_is_a_valid_task_beside_the_lightning_study(
    tmp_path: Path,
) -> None:
    from autotune.spec.command_task import CommandTask
    from autotune.spec.study_file import load

    block = block_after("studies/lightning_digits.yaml")
    study = REPO / "studies" / f"readme_example_{tmp_path.name}.yaml"  # beside lightning/train.py
    try:
        study.write_text(block + "target: {metric: accuracy, value: 0.95}\n")
        spec = load(study)
    finally:
        study.unlink()
    assert isinstance(spec.task, CommandTask) and dict(spec.task.env) == {
        "PYTHONHASHSEED": "{seed}"
    }
    assert spec.task.command.split()[:2] == ["python", "lightning/train.py"]


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(commands) >= 2 and "autotune run studies/digits.yaml" in commands[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert commands[1].strip() in ci.splitlines()


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    lines = README.count("\n") + (not README.endswith("\n"))
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}"
    for document in (*DOCUMENTS[1:], "docs/benchmarks.md", "docs/gpu.md", "CONTRIBUTING.md"):
        assert f"]({document})" in README, f"README.md does not link {document}"


def headings(text: str) -> set[str]:
    """GitHub's anchors for a Markdown text's headings (those outside code blocks)."""
    anchors: set[str] = set()
    for line in re.sub(r"^```.*?^```", "", text, flags=re.S | re.M).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchor, n = slug, 0
            while anchor in anchors:  # GitHub numbers a repeated heading's anchor
                n += 1
                anchor = f"{slug}-{n}"
            anchors.add(anchor)
    return anchors


@pytest.mark.parametrize(
    "document", [*TEXTS, "docs/benchmarks.md", "docs/gpu.md"], ids=lambda name: name
)
def test_every_link_between_the_documents_lands(document: str) -> None:
    """A relative link names a file that exists and, with #anchor, a heading of that file."""
    source = REPO / document
    text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https: and the like
        path, _, anchor = target.partition("#")
        file = (source.parent / path).resolve() if path else source
        if not file.exists() or (anchor and anchor not in headings(file.read_text())):
            broken.append(target)
    assert not broken, f"{document}: links that land nowhere: {broken}"
