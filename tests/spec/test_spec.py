"""autotune.spec.study_file.load: a valid study file becomes frozen dataclasses; a bad one raises
SpecError."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autotune.errors import SpecError
from autotune.search.space import DEFAULT_BASELINE, KNOBS, Choices, Range
from autotune.spec.sections import Budget, Confirm, Target
from autotune.spec.study_file import OLD_PROBE, StudySpec, load

REPO = Path(__file__).resolve().parents[2]
TARGET_ONLY = "target: {metric: accuracy, value: 0.97}\n"
HEAD = "task: digits\ntarget: {metric: accuracy, value: 0.97}\n"
NO_VALUE = object()  # a case whose message has no "got <value>" worth checking


def write(folder: Path, text: str, name: str = "study.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------
# A valid study file


VALID = (
    HEAD
    + """\
space:
  preset: default
  lr: {low: "1e-3", high: 0.3, log: true}
  num_workers: [0, 1]
  precision: fp32
  batch_size: [32, 64]
budget: {trials: 5}
"""
)


def test_valid_study_loads_with_documented_defaults(tmp_path: Path) -> None:
    """Unset keys get the documented defaults; the storage is a SQLite file beside the study
    file."""
    spec = load(write(tmp_path, VALID))

    assert isinstance(spec, StudySpec)
    assert spec.name == "study"  # the file's stem
    assert spec.task == "digits"
    assert spec.target == Target(metric="accuracy", value=0.97)
    # 2 x max_seconds + 60
    assert spec.budget == Budget(
        trials=5,
        timeout=None,
        max_epochs=10.0,
        max_seconds=60.0,
        eval_every=0.25,
        trial_timeout=180.0,
    )
    assert spec.storage == f"sqlite:///{tmp_path.resolve() / 'study.db'}"
    assert spec.seed == 0
    assert spec.device == "auto"
    assert spec.confirm == Confirm(top=3, runs=3, max_runs=8)
    # the budget's max_epochs
    assert dict(spec.baseline) == {
        **DEFAULT_BASELINE,
        "schedule_epochs": 10.0,
    }
    assert spec.objective == "time_to_target" and spec.replicates == 1


def test_space_merges_preset_with_per_knob_overrides(tmp_path: Path) -> None:
    """A range, a list and a scalar override the preset; untouched knobs keep the preset's
    domain."""
    space = load(write(tmp_path, VALID)).space

    assert [name for name, _ in space.domains] == list(KNOBS)
    # "1e-3" (text in YAML) read as a float
    assert space["lr"] == Range(low=0.001, high=0.3, log=True)
    assert space["num_workers"] == Choices((0, 1))
    assert space["precision"] == Choices(("fp32",))  # a scalar fixes the knob
    assert space["batch_size"] == Choices((32, 64))
    # From search/presets/default.yaml:
    assert space["scheduler"] == Choices(("constant", "step", "cosine", "onecycle"))
    assert space["accumulation_steps"] == Choices((1, 2, 4))
    assert space["prefetch_factor"] == Choices((2, 4, 8))
    assert space["pin_memory"] == Choices((False, True))
    # no schedule given: max_epochs; DDP's knobs, which no preset searches, at DDP's defaults
    assert space.fixed() == {
        "precision": "fp32",
        "schedule_epochs": 10.0,
        "ddp_bucket_cap_mb": 25,
        "ddp_gradient_as_bucket_view": False,
        "ddp_static_graph": False,
    }


def test_numbers_given_as_text_are_accepted(tmp_path: Path) -> None:
    """YAML reads 1e-3 as a string; float-valued keys accept it anyway."""
    text = (
        HEAD + 'space: {lr: ["1e-3", 0.01]}\n'
        'budget: {timeout: "1e3", max_epochs: "2.5", eval_every: "5e-1"}\n'
    )
    spec = load(write(tmp_path, text))

    assert spec.space["lr"] == Choices((0.001, 0.01))
    assert spec.budget.timeout == 1000.0
    assert spec.budget.max_epochs == 2.5
    assert spec.budget.eval_every == 0.5


def test_explicit_values_override_defaults(tmp_path: Path) -> None:
    """Every top-level key given in the file is used as given."""
    text = (
        HEAD
        + """\
name: mine
storage: sqlite:///elsewhere.db
seed: 7
device: cuda:1
budget: {trials: 3, timeout: 30, max_epochs: 2, max_seconds: 5, eval_every: 0.5, trial_timeout: 20}
baseline: {num_workers: 2, batch_size: 64}
confirm: {top: 0, runs: 5}
isolation: process
"""
    )
    spec = load(write(tmp_path, text))

    assert (spec.name, spec.storage, spec.seed, spec.device) == (
        "mine",
        "sqlite:///elsewhere.db",
        7,
        "cuda:1",
    )
    assert spec.budget == Budget(
        trials=3,
        timeout=30.0,
        max_epochs=2.0,
        max_seconds=5.0,
        eval_every=0.5,
        trial_timeout=20.0,
        trial_timeout_given=True,
    )
    assert spec.isolation == "process"
    assert spec.confirm == Confirm(top=0, runs=5)
    baseline = dict(spec.baseline)
    assert baseline["num_workers"] == 2 and baseline["batch_size"] == 64
    assert baseline["prefetch_factor"] == 2  # PyTorch's default once workers are used


def test_storage_argument_overrides_the_file(tmp_path: Path) -> None:
    """`load(..., storage=...)` (the --storage option) wins over the file's storage."""
    path = write(tmp_path, HEAD + "storage: sqlite:///a.db\n")
    assert load(path, storage="sqlite:///b.db").storage == "sqlite:///b.db"


def test_trials_and_timeout_arguments_override_the_budget(tmp_path: Path) -> None:
    """--trials and --timeout are applied to the spec once, at load: every layer reads the
    budget."""
    path = write(tmp_path, HEAD + "budget: {trials: 3, timeout: 30, max_epochs: 2}\n")
    assert (load(path).budget.trials, load(path).budget.timeout) == (3, 30.0)
    spec = load(path, trials=7, timeout=12.5)
    assert (spec.budget.trials, spec.budget.timeout, spec.budget.max_epochs) == (7, 12.5, 2.0)
    assert load(path, trials=5).budget.timeout == 30.0


def test_default_storage_is_beside_the_file_whatever_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative study path still gives an absolute storage path next to the study file."""
    (tmp_path / "studies").mkdir()
    write(tmp_path / "studies", HEAD, "exp.yaml")
    monkeypatch.chdir(tmp_path)

    spec = load("studies/exp.yaml")

    assert spec.storage == f"sqlite:///{tmp_path.resolve() / 'studies' / 'exp.db'}"
    assert spec.name == "exp"


def test_preset_by_path_relative_to_the_study_file(tmp_path: Path) -> None:
    """`preset: my.yaml` is read from beside the study file."""
    preset = (
        (REPO / "autotune" / "search" / "presets" / "default.yaml")
        .read_text()
        .replace("[16, 32, 64, 128, 256]", "[8]")
    )
    write(tmp_path, preset, "my.yaml")
    spec = load(write(tmp_path, HEAD + "space: {preset: my.yaml}\n"))
    assert spec.space["batch_size"] == Choices((8,))


def test_spec_is_frozen(tmp_path: Path) -> None:
    """The spec and the parts inside it cannot be changed after loading."""
    spec = load(write(tmp_path, VALID))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.budget.trials = 100  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.target.value = 0.5  # type: ignore[misc]
    assert isinstance(spec.baseline, tuple) and isinstance(spec.space.domains, tuple)


def test_fixed_schedule_searches_the_schedule_up_to_max_epochs_with_two_seeds(
    tmp_path: Path,
) -> None:
    """Without a schedule_epochs domain: a log range from an eighth of max_epochs to all of it;
    the baseline keeps the whole max_epochs; replicates default to 2, and a study file's win."""
    spec = load(write(tmp_path, HEAD + "objective: fixed_schedule\nbudget: {max_epochs: 8}\n"))
    assert spec.objective == "fixed_schedule" and spec.replicates == 2
    assert spec.space["schedule_epochs"] == Range(low=1.0, high=8.0, log=True)
    assert dict(spec.baseline)["schedule_epochs"] == 8.0
    spec = load(
        write(
            tmp_path,
            HEAD + "objective: fixed_schedule\nreplicates: 3\nspace: {schedule_epochs: [2, 4]}\n",
        )
    )
    assert spec.replicates == 3 and spec.space["schedule_epochs"] == Choices((2, 4))


def test_shipped_digits_study_loads() -> None:
    """The example study file in studies/ is valid."""
    spec = load(REPO / "studies" / "digits.yaml")
    assert spec.task == "digits"
    assert spec.target.value == 0.97
    assert spec.space["num_workers"] == Choices((0, 1, 2))
    assert spec.budget.trials == 20 and spec.budget.max_epochs == 8.0


# ---------------------------------------------------------------------------------------------
# Bad study files: (id, file text or None for a missing file, offending key, value, fragment)


BAD: list[tuple[str, str | None, str, Any, str]] = [
    ("malformed yaml", HEAD + "space: {lr: [0.1, 0.2}\n", "(yaml)", NO_VALUE, "not valid YAML"),
    (
        "duplicate key",
        HEAD + "space:\n  lr: 0.1\n  batch_size: 32\n  lr: 0.2\n",
        "lr (line 6)",
        "lr",
        "given twice",
    ),
    (
        "duplicate top-level key",
        HEAD + "seed: 1\nseed: 2\n",
        "seed (line 4)",
        "seed",
        "given twice",
    ),
    (
        "tab indentation",
        HEAD + "space:\n\tlr: 0.1\n",
        "(yaml)",
        "line 4, column 1",
        "not valid YAML",
    ),
    ("top level is a list", "- task: digits\n", "(top level)", [{"task": "digits"}], "mapping"),
    ("empty file", "", "(top level)", None, "mapping"),
    ("missing task", "target: {metric: accuracy, value: 0.97}\n", "task", None, "task is required"),
    ("missing target", "task: digits\n", "target", None, "target is required"),
    (
        "task not a string",
        "task: 5\ntarget: {metric: accuracy, value: 0.97}\n",
        "task",
        5,
        "package.module:callable",
    ),
    (
        "unknown top-level key",
        HEAD + "budjet: {trials: 3}\n",
        "budjet",
        "budjet",
        "did you mean 'budget'?",
    ),
    ("target not a mapping", "task: digits\ntarget: 0.97\n", "target", 0.97, "metric, value"),
    (
        "target value not a number",
        "task: digits\ntarget: {metric: accuracy, value: high}\n",
        "target.value",
        "high",
        "a finite number",
    ),
    (
        "unknown key in target",
        "task: digits\ntarget: {metric: accuracy, valeu: 0.9}\n",
        "target.valeu",
        "valeu",
        "did you mean 'value'?",
    ),
    (
        "unknown key in budget",
        HEAD + "budget: {max_epoch: 3}\n",
        "budget.max_epoch",
        "max_epoch",
        "did you mean 'max_epochs'?",
    ),
    ("budget not a mapping", HEAD + "budget: 10\n", "budget", 10, "a mapping"),
    (
        "trials is text",
        HEAD + "budget: {trials: ten}\n",
        "budget.trials",
        "ten",
        "a whole number from 1 to 1,000,000",
    ),
    (
        "trials is zero",
        HEAD + "budget: {trials: 0}\n",
        "budget.trials",
        0,
        "a whole number from 1 to 1,000,000",
    ),
    (
        "trials past what a study counts",
        HEAD + "budget: {trials: 10000000000}\n",
        "budget.trials",
        10**10,
        "a whole number from 1 to 1,000,000",
    ),
    # Values a float holds but a trial's loop cannot count with (1e308 epochs of steps overflow).
    (
        "max_epochs overflows the loop",
        HEAD + "budget: {max_epochs: 1e308}\n",
        "budget.max_epochs",
        1e308,
        "at most 1,000,000",
    ),
    (
        "eval_every overflows the loop",
        HEAD + "budget: {eval_every: 1e308}\n",
        "budget.eval_every",
        1e308,
        "at most 1,000,000",
    ),
    (
        "max_seconds past what a wait holds",
        HEAD + "budget: {max_seconds: 1e300}\n",
        "budget.max_seconds",
        1e300,
        "at most 10,000,000",
    ),
    (
        "timeout past what a wait holds",
        HEAD + "budget: {timeout: 1e300}\n",
        "budget.timeout",
        1e300,
        "at most",
    ),
    (
        "trial_timeout past what a wait holds",
        HEAD + "budget: {trial_timeout: 1e300}\n",
        "budget.trial_timeout",
        1e300,
        "at most",
    ),
    (
        "trials is a bool",
        HEAD + "budget: {trials: true}\n",
        "budget.trials",
        True,
        "a whole number",
    ),
    (
        "trials is a float",
        HEAD + "budget: {trials: 10.0}\n",
        "budget.trials",
        10.0,
        "a whole number",
    ),
    (
        "max_epochs is zero",
        HEAD + "budget: {max_epochs: 0}\n",
        "budget.max_epochs",
        0,
        "greater than 0",
    ),
    (
        "max_epochs is huge",
        HEAD + "budget: {max_epochs: " + "9" * 400 + "}\n",
        "budget.max_epochs",
        NO_VALUE,
        "a finite number",
    ),
    (
        "max_seconds is infinite",
        HEAD + "budget: {max_seconds: .inf}\n",
        "budget.max_seconds",
        float("inf"),
        "a finite number greater than 0",
    ),
    (
        "target value is nan",
        "task: digits\ntarget: {metric: accuracy, value: .nan}\n",
        "target.value",
        NO_VALUE,
        "a finite number",
    ),
    (
        "eval_every is negative",
        HEAD + "budget: {eval_every: -1}\n",
        "budget.eval_every",
        -1,
        "greater than 0",
    ),
    (
        "timeout is negative",
        HEAD + "budget: {timeout: -5}\n",
        "budget.timeout",
        -5,
        "greater than 0",
    ),
    (
        "timeout is text",
        HEAD + "budget: {timeout: soon}\n",
        "budget.timeout",
        "soon",
        "a finite number",
    ),
    ("seed is negative", HEAD + "seed: -1\n", "seed", -1, "from 0 to 2147483647"),
    # Derived seeds (the sampler's: seed + trials so far) must fit numpy's 32 bits on every resume.
    ("seed past 32 bits", HEAD + "seed: 4294967295\n", "seed", 4294967295, "from 0 to 2147483647"),
    (
        "seed far past 64 bits",
        HEAD + "seed: 99999999999999999999999\n",
        "seed",
        99999999999999999999999,
        "from 0 to",
    ),
    ("seed is a float", HEAD + "seed: 1.5\n", "seed", 1.5, "a whole number"),
    ("empty name", HEAD + "name: ''\n", "name", "", "non-empty string"),
    ("name with a NUL", HEAD + 'name: "a\\0b"\n', "name", "a\0b", "printable characters"),
    ("name with a newline", HEAD + 'name: "a\\nb"\n', "name", "a\nb", "printable characters"),
    (
        "unknown knob",
        HEAD + "space: {batchsize: [32]}\n",
        "space.batchsize",
        "batchsize",
        "did you mean 'batch_size'?",
    ),
    ("space not a mapping", HEAD + "space: [lr]\n", "space", ["lr"], "a mapping"),
    (
        "inverted range",
        HEAD + "space: {lr: {low: 0.5, high: 0.1}}\n",
        "space.lr",
        {"low": 0.5, "high": 0.1},
        "low < high",
    ),
    (
        "equal low and high",
        HEAD + "space: {lr: {low: 0.1, high: 0.1}}\n",
        "space.lr",
        {"low": 0.1, "high": 0.1},
        "low < high",
    ),
    (
        "log range from zero",
        HEAD + "space: {num_workers: {low: 0, high: 4, log: true}}\n",
        "space.num_workers.low",
        0,
        "log-scale range needs low > 0",
    ),
    (
        "lr range from zero",
        HEAD + "space: {lr: {low: 0, high: 0.1}}\n",
        "space.lr.low",
        0,
        "greater than 0",
    ),
    (
        "log is not a bool",
        HEAD + "space: {lr: {low: 0.01, high: 0.1, log: 1}}\n",
        "space.lr.log",
        1,
        "true or false",
    ),
    (
        "unknown key in range",
        HEAD + "space: {batch_size: {low: 8, high: 64, step: 8}}\n",
        "space.batch_size.step",
        "step",
        "low, high, log",
    ),
    (
        "range missing high",
        HEAD + "space: {lr: {low: 0.01}}\n",
        "space.lr.high",
        None,
        "both low and high",
    ),
    (
        "int range with float bound",
        HEAD + "space: {batch_size: {low: 16.0, high: 64}}\n",
        "space.batch_size.low",
        16.0,
        "whole number",
    ),
    (
        "range on a categorical knob",
        HEAD + "space: {scheduler: {low: 1, high: 2}}\n",
        "space.scheduler",
        {"low": 1, "high": 2},
        "not a range",
    ),
    (
        "empty choices",
        HEAD + "space: {batch_size: []}\n",
        "space.batch_size",
        [],
        "at least one value",
    ),
    (
        "repeated choices",
        HEAD + "space: {batch_size: [32, 64, 32]}\n",
        "space.batch_size",
        [32, 64, 32],
        "must not repeat",
    ),
    (
        "unknown scheduler",
        HEAD + "space: {scheduler: [cosine, linear]}\n",
        "space.scheduler[1]",
        "linear",
        "constant, step, cosine, onecycle",
    ),
    (
        "unknown precision",
        HEAD + "space: {precision: fp8}\n",
        "space.precision",
        "fp8",
        "fp32, fp16, bf16",
    ),
    ("batch_size zero", HEAD + "space: {batch_size: 0}\n", "space.batch_size", 0, "at least 1"),
    (
        "num_workers negative",
        HEAD + "space: {num_workers: [0, -1]}\n",
        "space.num_workers[1]",
        -1,
        "at least 0",
    ),
    (
        "pin_memory not a bool",
        HEAD + "space: {pin_memory: [0, 1]}\n",
        "space.pin_memory[0]",
        0,
        "true or false",
    ),
    (
        "lr is huge",
        HEAD + "space: {lr: " + "9" * 400 + "}\n",
        "space.lr",
        NO_VALUE,
        "a finite number",
    ),
    ("lr is nan", HEAD + "space: {lr: .nan}\n", "space.lr", NO_VALUE, "lr takes a finite number"),
    (
        "param bound is infinite",
        HEAD + "space: {params: {width: {low: 1, high: .inf}}}\n",
        "space.params.width.high",
        float("inf"),
        "a finite number",
    ),
    (
        "unknown preset",
        HEAD + "space: {preset: huge}\n",
        "space.preset",
        "huge",
        "built-in presets: default",
    ),
    (
        "missing preset file",
        HEAD + "space: {preset: nowhere.yaml}\n",
        "space.preset",
        "nowhere.yaml",
        "no such preset",
    ),
    ("bad device", HEAD + "device: gpu\n", "device", "gpu", "auto, cpu, cuda or cuda:N"),
    ("bad device index", HEAD + "device: 'cuda:x'\n", "device", "cuda:x", "cuda:N"),
    ("storage without scheme", HEAD + "storage: study.db\n", "storage", "study.db", "sqlite:///"),
    (
        "storage unknown scheme",
        HEAD + "storage: redis://localhost/0\n",
        "storage",
        "redis://localhost/0",
        "storage URL",
    ),
    ("storage not a string", HEAD + "storage: 5\n", "storage", 5, "storage URL"),
    (
        "unknown key in baseline",
        HEAD + "baseline: {batchsize: 64}\n",
        "baseline.batchsize",
        "batchsize",
        "did you mean 'batch_size'?",
    ),
    ("bad baseline lr", HEAD + "baseline: {lr: -0.1}\n", "baseline.lr", -0.1, "greater than 0"),
    (
        "bad baseline precision",
        HEAD + "baseline: {precision: half}\n",
        "baseline.precision",
        "half",
        "fp32, fp16, bf16",
    ),
    ("baseline is a list", HEAD + "baseline: [lr]\n", "baseline", ["lr"], "a mapping"),
    ("confirm runs negative", HEAD + "confirm: {runs: -1}\n", "confirm.runs", -1, "from 0 to 1000"),
    (
        "confirm runs a trillion",
        HEAD + "confirm: {runs: 1000000000000}\n",
        "confirm.runs",
        10**12,
        "from 0 to 1000",
    ),
    (
        "unknown key in confirm",
        HEAD + "confirm: {seeds: 3}\n",
        "confirm.seeds",
        "seeds",
        "top, runs",
    ),
    ("missing study file", None, "(file)", NO_VALUE, "no such file"),
    # A training command as the task.
    (
        "command task misspelt key",
        TARGET_ONLY + "task: {comand: python train.py}\n",
        "task.comand",
        "comand",
        "did you mean 'command'?",
    ),
    (
        "command task without a command",
        TARGET_ONLY + "task: {env: {A: b}}\n",
        "task.command",
        None,
        "a command line",
    ),
    (
        "command names an unknown placeholder",
        TARGET_ONLY + "task: {command: 'python train.py --lr {lrr}'}\n",
        "task.command",
        "python train.py --lr {lrr}",
        "unknown placeholder {lrr} (did you mean {lr}?)",
    ),
    (
        "command program missing",
        TARGET_ONLY + "task: {command: './nosuch.sh --lr {lr}'}\n",
        "task.command",
        "./nosuch.sh --lr {lr}",
        "not an executable file",
    ),
    (
        "command env value is a list",
        TARGET_ONLY + "task: {command: 'python t.py', env: {A: [1]}}\n",
        "task.env.A",
        [1],
        "a string or a number",
    ),
    ("unknown prune mode", HEAD + "prune: median\n", "prune", "median", "incumbent (stop a trial"),
    (
        "unknown probe mode",
        HEAD + "probe: all\n",
        "probe",
        "all",
        "joint (choose DataLoader settings",
    ),
    (
        "unknown objective",
        HEAD + "objective: accuracy\n",
        "objective",
        "accuracy",
        "time_to_target (stop each run",
    ),
    ("replicates zero", HEAD + "replicates: 0\n", "replicates", 0, "a whole number from 1 to 20"),
    (
        "replicates a fraction",
        HEAD + "replicates: 1.5\n",
        "replicates",
        1.5,
        "a whole number from 1 to 20",
    ),
    (
        "fixed schedule for a command",
        TARGET_ONLY + "task: {command: 'python t.py'}\nobjective: fixed_schedule\n",
        "objective",
        "fixed_schedule",
        "needs a built-in or Python task",
    ),
    (
        "schedule longer than max_epochs",
        HEAD + "budget: {max_epochs: 4}\nspace: {schedule_epochs: {low: 1, high: 6}}\n",
        "space.schedule_epochs",
        {"low": 1, "high": 6},
        "at most budget.max_epochs (4)",
    ),
    (
        "schedule of zero epochs",
        HEAD + "space: {schedule_epochs: [0, 2]}\n",
        "space.schedule_epochs[0]",
        0,
        "greater than 0",
    ),
    (
        "baseline schedule too long",
        HEAD + "budget: {max_epochs: 4}\nbaseline: {schedule_epochs: 5}\n",
        "baseline.schedule_epochs",
        5,
        "at most budget.max_epochs (4)",
    ),
    # The user's own parameters (space.params).
    (
        "params not a mapping",
        HEAD + "space: {params: [width]}\n",
        "space.params",
        ["width"],
        "a mapping",
    ),
    (
        "param name not an identifier",
        HEAD + "space: {params: {hidden-size: [8]}}\n",
        "space.params.hidden-size",
        "hidden-size",
        "Python identifier",
    ),
    (
        "param named like a knob",
        HEAD + "space: {params: {lr: [0.1]}}\n",
        "space.params.lr",
        "lr",
        "one of the knobs",
    ),
    (
        "param named seed",
        HEAD + "space: {params: {seed: [1, 2]}}\n",
        "space.params.seed",
        "seed",
        "reserved",
    ),
    (
        "param inverted range",
        HEAD + "space: {params: {width: {low: 64, high: 16}}}\n",
        "space.params.width",
        {"low": 64, "high": 16},
        "low < high",
    ),
    (
        "param log range from zero",
        HEAD + "space: {params: {wd: {low: 0, high: 0.1, log: true}}}\n",
        "space.params.wd.low",
        0,
        "low > 0",
    ),
    (
        "param range bound is text",
        HEAD + "space: {params: {dropout: {low: none, high: 0.5}}}\n",
        "space.params.dropout.low",
        "none",
        "a finite number",
    ),
    (
        "param range misspelt key",
        HEAD + "space: {params: {dropout: {low: 0, hihg: 0.5}}}\n",
        "space.params.dropout.hihg",
        "hihg",
        "did you mean 'high'?",
    ),
    (
        "param empty choices",
        HEAD + "space: {params: {optimizer: []}}\n",
        "space.params.optimizer",
        [],
        "at least one value",
    ),
    (
        "param choice is a list",
        HEAD + "space: {params: {sizes: [[8, 16]]}}\n",
        "space.params.sizes[0]",
        [8, 16],
        "a number, a string or true/false",
    ),
    (
        "param repeated choices",
        HEAD + "space: {params: {act: [relu, relu]}}\n",
        "space.params.act",
        ["relu", "relu"],
        "must not repeat",
    ),
    (
        "baseline of an unknown param",
        HEAD + "space: {params: {width: [8, 16]}}\nbaseline: {widht: 8}\n",
        "baseline.widht",
        "widht",
        "did you mean 'width'?",
    ),
    (
        "baseline param is a list",
        HEAD + "space: {params: {width: [8, 16]}}\nbaseline: {width: [8]}\n",
        "baseline.width",
        [8],
        "a number, a string or true/false",
    ),
    (
        "checkpointing share above 1",
        HEAD + "space: {checkpointing: [false, 1.5]}\n",
        "space.checkpointing[1]",
        1.5,
        "checkpointing takes true, false or a fraction between 0 and 1",
    ),
    (
        "checkpointing as text",
        HEAD + "baseline: {checkpointing: half}\n",
        "baseline.checkpointing",
        "half",
        "checkpointing takes true, false or a fraction between 0 and 1",
    ),
    (
        "checkpointing range",
        HEAD + "space: {checkpointing: {low: 0.25, high: 1}}\n",
        "space.checkpointing",
        {"low": 0.25, "high": 1},
        "checkpointing takes a list of choices or one value, not a range",
    ),
    (
        "checkpointing off twice",
        HEAD + "space: {checkpointing: [false, 0]}\n",
        "space.checkpointing",
        [False, 0],
        "choices must not repeat",
    ),
    (
        "ddp_bucket_cap_mb of 0",
        HEAD + "space: {ddp_bucket_cap_mb: [25, 0]}\n",
        "space.ddp_bucket_cap_mb[1]",
        0,
        "ddp_bucket_cap_mb takes a whole number of at least 1",
    ),
    (
        "ddp_bucket_cap_mb as a fraction",
        HEAD + "baseline: {ddp_bucket_cap_mb: 2.5}\n",
        "baseline.ddp_bucket_cap_mb",
        2.5,
        "ddp_bucket_cap_mb takes a whole number of at least 1",
    ),
    (
        "ddp_bucket_cap_mb range below 1",
        HEAD + "space: {ddp_bucket_cap_mb: {low: 0, high: 100}}\n",
        "space.ddp_bucket_cap_mb.low",
        0,
        "ddp_bucket_cap_mb takes a whole number of at least 1",
    ),
    (
        "ddp_gradient_as_bucket_view as text",
        HEAD + "space: {ddp_gradient_as_bucket_view: [false, yes please]}\n",
        "space.ddp_gradient_as_bucket_view[1]",
        "yes please",
        "ddp_gradient_as_bucket_view takes true or false",
    ),
    (
        "ddp_static_graph as a number",
        HEAD + "space: {ddp_static_graph: 1}\n",
        "space.ddp_static_graph",
        1,
        "ddp_static_graph takes true or false",
    ),
    (
        "ddp_static_graph range",
        HEAD + "space: {ddp_static_graph: {low: 0, high: 1}}\n",
        "space.ddp_static_graph",
        {"low": 0, "high": 1},
        "ddp_static_graph takes a list of choices or one value, not a range",
    ),
]


@pytest.mark.parametrize(
    ("text", "key", "value", "fragment"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_study_file_raises_spec_error(
    tmp_path: Path, text: str | None, key: str, value: Any, fragment: str
) -> None:
    """The message names the file, the key, the value it got and what would be accepted."""
    path = tmp_path / "study.yaml"
    if text is not None:
        path.write_text(text)

    with pytest.raises(SpecError) as info:
        load(path)

    message = str(info.value)
    assert message.startswith(f"{path}: {key}: got "), message
    if value is not NO_VALUE:
        assert f"{key}: got {value!r};" in message, message
    assert fragment in message, message
    assert "\n" not in message, message  # the CLI prints it as one line
    assert (info.value.path, info.value.key) == (path, key)


@pytest.mark.parametrize("kind", ["character device", "FIFO", "directory", "too large"])
def test_a_study_file_that_is_not_a_page_of_yaml_is_refused_before_it_is_read(
    tmp_path: Path, kind: str
) -> None:
    """/dev/zero would be read until memory runs out and a FIFO would block forever: each is
    refused from what the file is, at once, as is a regular file larger than a study file can be."""
    if kind == "character device":
        path = Path("/dev/zero")
    elif kind == "FIFO":
        path = tmp_path / "study.yaml"
        os.mkfifo(path)

        # Were the FIFO opened for reading, this writer would unblock it after a while: the test
        # then fails, not hangs.
        def open_the_writing_end() -> None:
            with contextlib.suppress(OSError):  # ENXIO: no reader has it open, as it should be
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

        unblock = threading.Timer(5, open_the_writing_end)
        unblock.daemon = True
        unblock.start()
    elif kind == "directory":
        path = tmp_path
    else:
        path = tmp_path / "study.yaml"
        path.write_text(HEAD + "#" * (2 << 20) + "\n")
    started = time.monotonic()
    try:
        with pytest.raises(SpecError) as info:
            load(path)
    finally:
        if kind == "FIFO":
            unblock.cancel()
    assert time.monotonic() - started < 2
    assert info.value.key == "(file)" and (
        kind in str(info.value) or "larger than 1 MiB" in str(info.value)
    )


def test_bad_preset_file_is_named_in_the_error(tmp_path: Path) -> None:
    """A preset that leaves a knob out is reported against the preset file, naming the knob."""
    preset = write(tmp_path, "lr: 0.1\n", "partial.yaml")
    with pytest.raises(SpecError) as info:
        load(write(tmp_path, HEAD + "space: {preset: partial.yaml}\n"))
    assert str(info.value).startswith(f"{preset.resolve()}: scheduler: ")
    assert "every knob" in str(info.value)


def test_checkpointing_reads_0_and_1_as_off_and_on_and_is_off_by_default(tmp_path: Path) -> None:
    spec = load(write(tmp_path, HEAD + "space: {checkpointing: [0, 0.5, 1]}\n"))
    assert spec.space["checkpointing"] == Choices((False, 0.5, True))
    assert [type(v) for v in spec.space["checkpointing"].values] == [bool, float, bool]
    assert dict(spec.baseline)["checkpointing"] is False
    default = load(write(tmp_path, HEAD + "baseline: {checkpointing: 1}\n", "other.yaml"))
    assert default.space["checkpointing"] == Choices((False, True))  # the default preset
    assert dict(default.baseline)["checkpointing"] is True


def test_ddp_knobs_are_ddp_defaults_unless_named(tmp_path: Path) -> None:
    """Left out of both presets: DDP's own defaults, fixed; a study file may search them."""
    for preset in ("default", "systems"):
        spec = load(write(tmp_path, HEAD + f"space: {{preset: {preset}}}\n", f"{preset}.yaml"))
        assert spec.space["ddp_bucket_cap_mb"] == Choices((25,))
        assert spec.space["ddp_gradient_as_bucket_view"] == Choices((False,))
        assert spec.space["ddp_static_graph"] == Choices((False,))
    named = load(
        write(
            tmp_path,
            HEAD
            + "devices_per_trial: 2\n"
            + "space: {ddp_bucket_cap_mb: {low: 5, high: 100, log: true}, "
            + "ddp_gradient_as_bucket_view: [false, true], ddp_static_graph: true}\n"
            + "baseline: {ddp_bucket_cap_mb: 50}\n",
        )
    )
    assert named.space["ddp_bucket_cap_mb"] == Range(5, 100, log=True)
    assert named.space["ddp_gradient_as_bucket_view"] == Choices((False, True))
    assert named.space["ddp_static_graph"] == Choices((True,))
    baseline = dict(named.baseline)
    assert (baseline["ddp_bucket_cap_mb"], baseline["ddp_static_graph"]) == (50, False)


def test_params_sit_beside_the_knobs_with_their_types(tmp_path: Path) -> None:
    """Whole-number bounds make an integer range, a list is choices, a value is fixed; the
    baseline takes the middle of each domain unless the file gives one."""
    spec = load(
        write(
            tmp_path,
            HEAD
            + (
                "space:\n  params:\n"
                "    width: {low: 16, high: 64}\n"
                "    dropout: {low: 0.0, high: 0.5}\n"
                "    weight_decay: {low: 1.0e-5, high: 1.0e-3, log: true}\n"
                "    optimizer: [sgd, adamw]\n"
                "    depth: 3\n"
                "baseline: {optimizer: adamw}\n"
            ),
        )
    )
    params = dict(spec.space.params)
    assert list(params) == ["width", "dropout", "weight_decay", "optimizer", "depth"]
    assert params["width"] == Range(16, 64) and isinstance(params["width"].low, int)
    assert params["dropout"] == Range(0.0, 0.5) and isinstance(params["dropout"].low, float)
    assert params["weight_decay"] == Range(1e-5, 1e-3, log=True)
    assert params["optimizer"] == Choices(("sgd", "adamw")) and params["depth"] == Choices((3,))
    assert [name for name, _ in spec.space.domains] == list(KNOBS)  # the knobs are untouched
    baseline = dict(spec.baseline)
    assert baseline["width"] == 40 and baseline["dropout"] == 0.25 and baseline["depth"] == 3
    assert baseline["weight_decay"] == pytest.approx(1e-4)  # geometric middle of a log range
    assert baseline["optimizer"] == "adamw"  # given in the file


def test_the_probe_is_joint_unless_the_file_says_and_goodput_needs_it(tmp_path: Path) -> None:
    """One probe: `joint` by default, `none` where the file says; the name of an earlier engine
    reads as the joint probe, so study files that name it still run. Goodput and systems_only
    time their trials from the probe's table: without it they are refused, naming the key."""
    assert load(write(tmp_path, HEAD)).probe == "joint"
    assert load(write(tmp_path, HEAD + "probe: none\n", "named.yaml")).probe == "none"
    earlier = HEAD + f"probe: {OLD_PROBE}\n"
    assert load(write(tmp_path, earlier, "earlier.yaml")).probe == "joint"
    for objective in ("goodput", "systems_only"):
        with pytest.raises(SpecError) as raised:
            load(write(tmp_path, HEAD + f"objective: {objective}\nprobe: none\n", "g.yaml"))
        said = str(raised.value)
        assert "probe" in said and "joint" in said and objective in said
    with pytest.raises(SpecError, match="joint"):
        load(write(tmp_path, HEAD + "probe: greedy\n", "bad.yaml"))


def test_the_first_trials_come_from_the_prior_unless_the_file_says(tmp_path: Path) -> None:
    """A new study starts from the prior (a larger batch, a scaled lr, an annealing schedule);
    the sampler's start and the baseline's stay reachable."""
    assert load(write(tmp_path, HEAD)).first_trial == "prior"
    for mode in ("sampled", "baseline"):
        named = write(tmp_path, HEAD + f"first_trial: {mode}\n", f"{mode}.yaml")
        assert load(named).first_trial == mode
