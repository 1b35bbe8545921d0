"""Every export format builds the real objects of its trainer with the winner's values.

Lightning's Trainer, transformers' TrainingArguments (and the Trainer's optimizer, scheduler and
DataLoader), torch's DataLoader, the torch module exec'd and trained a few steps against
autotune.train.trial, and the flags parsed back by argparse; then all of them for a real digits
study. The systems knobs (channels_last, compile, cudnn_benchmark) go into each where it has a place
and into a note where it has none; a winner stored before they existed ran without them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import itertools
import json
import math
import operator
import re
import shlex
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import transformers
import yaml
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR
from lightning.pytorch.plugins.precision import MixedPrecision
from torch._dynamo.eval_frame import OptimizedModule
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler, TensorDataset

from autotune.cli import main
from autotune.errors import AutotuneError
from autotune.export import FORMATS, render
from autotune.export.formats import RENDERERS  # each but command, which needs a command study
from autotune.record.summary import Counts, Summary, Target, Winner
from autotune.report.summarize import of_study
from autotune.search.knob import DDP_NAMES, PRECISIONS
from autotune.search.space import KNOBS, SCHEDULERS
from autotune.spec import study_file
from autotune.storage import opening
from autotune.train import checkpointing, systems
from autotune.train.config import TrialConfig
from autotune.train.loader import endless, make_loader
from autotune.train.tasks import digits, sgd, takes
from autotune.train.training import DTYPES, make_scheduler, train_step
from tests.tasks import ActivationBudgetNet, _blobs, _tunable_mlp, _tunable_optimizer, lrs_of

REPO = Path(__file__).resolve().parents[2]
BUILT_IN = "autotune.train.tasks:sgd"
STORED_BUILT_IN = "autotune.tasks:sgd"  # its name in studies stored before the tasks moved
TUNABLE = "tests.tasks:_tunable_optimizer"
NOTED = ("moved", "approximation", "no equivalent")


SYSTEMS = (
    "data_on_device",
    "channels_last",
    "compile",
    "cudnn_benchmark",
    "tf32",
    "fused_optimizer",
    "checkpointing",
)


def knobs(
    lr: float,
    scheduler: str,
    batch_size: int,
    accumulation_steps: int,
    num_workers: int,
    precision: str,
    *,
    channels_last: bool = False,
    compile: bool = False,
    cudnn_benchmark: bool = False,
    tf32: bool = False,
    fused_optimizer: bool = False,
    checkpointing: bool | float = False,
) -> dict[str, Any]:
    return {
        "lr": lr,
        "scheduler": scheduler,
        "batch_size": batch_size,
        "accumulation_steps": accumulation_steps,
        "data_on_device": False,
        "num_workers": num_workers,
        "prefetch_factor": 3 if num_workers else None,
        "pin_memory": False,
        "precision": precision,
        "channels_last": channels_last,
        "compile": compile,
        "cudnn_benchmark": cudnn_benchmark,
        "tf32": tf32,
        "fused_optimizer": fused_optimizer,
        "checkpointing": checkpointing,
    }


# Every scheduler, both precisions a CPU runs, with and without workers and accumulation, each
# systems knob on somewhere, each with the user's own parameters (width and dropout go to
# tests.tasks' model, the rest to its optimizer).
CASES = {
    "constant-fp32": (
        knobs(0.05, "constant", 16, 1, 0, "fp32"),
        {"width": 24, "dropout": 0.1},
        BUILT_IN,
    ),
    "step-bf16-workers-cudnn-fused": (
        knobs(0.1, "step", 8, 2, 2, "bf16", cudnn_benchmark=True, fused_optimizer=True),
        {"width": 16},
        BUILT_IN,
    ),
    "cosine-fp32-accumulate3-compile": (
        knobs(0.02, "cosine", 8, 3, 1, "fp32", compile=True),
        {"dropout": 0.0},
        BUILT_IN,
    ),
    "onecycle-bf16-adamw-channels-last": (
        knobs(0.003, "onecycle", 16, 2, 0, "bf16", channels_last=True),
        {"width": 20, "weight_decay": 1e-4, "kind": "adamw"},
        TUNABLE,
    ),
}


def summary_for(
    params: Mapping[str, Any],
    *,
    optimizer: str | None = BUILT_IN,
    device: str | None = "cpu",
    max_epochs: float | None = 3,
) -> Summary:
    """A summary as report/summarize.py makes it, for a winner with `params` confirmed on 2
    seeds."""
    limits = (
        None
        if max_epochs is None
        else {"max_epochs": max_epochs, "max_seconds": 10.0, "eval_every": 0.5}
    )
    best = Winner(
        trial=3,
        label="trial 3",
        params=dict(params),
        time_to_target=1.25,
        metric=0.93,
        runs=2,
        reached=2,
        min=1.1,
        max=1.4,
        source="confirmed",
        epochs=1.5,
    )
    counts = Counts(**{field.name: 0 for field in dataclasses.fields(Counts)})
    return Summary(
        study="unit",
        target=Target(metric="accuracy", value=0.9),
        counts=counts,
        best=best,
        speedup=1.4,
        limits=limits,
        optimizer=optimizer,
        device=device,
    )


def schedule(summary: Summary) -> float:
    """The winner's schedule length: its schedule_epochs, else the study's max_epochs."""
    return summary.best.params.get("schedule_epochs") or summary.limits["max_epochs"]


def case(name: str) -> dict[str, Any]:
    knob_values, extras, optimizer = CASES[name]
    return summary_for({**knob_values, **extras}, optimizer=optimizer)


def knobs_and_params(summary: Summary) -> tuple[dict[str, Any], dict[str, Any]]:
    """The winner's knobs, a systems knob it lacks as false (the study predates it), and its
    parameters."""
    params = summary.best.params
    return (
        {
            k: params[k] if k in params else KNOBS[k].absent
            for k in KNOBS
            if k in params or KNOBS[k].absent is not None
        },
        {k: v for k, v in params.items() if k not in KNOBS},
    )


def reference_optimizer(summary: Summary, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer autotune's trial builds for this winner."""
    knob_values, extras = knobs_and_params(summary)
    factory = sgd if summary.optimizer in (BUILT_IN, STORED_BUILT_IN) else _tunable_optimizer
    fused = {"fused": True} if knob_values.get("fused_optimizer") else {}
    return factory(
        model.parameters(), knob_values["lr"], **takes(factory, extras, after=2), **fused
    )


def reference_lrs(summary: Summary, total_steps: int) -> list[float]:
    """The lr of each optimizer step of training.make_scheduler over `total_steps`."""
    knob_values, _ = knobs_and_params(summary)
    optimizer = reference_optimizer(summary, torch.nn.Linear(1, 1))
    scheduler = make_scheduler(
        knob_values["scheduler"], optimizer, total_steps=total_steps, lr=knob_values["lr"]
    )
    return lrs_of(optimizer, scheduler, total_steps)


def blobs_model(summary: Summary) -> torch.nn.Module:
    return _tunable_mlp(**takes(_tunable_mlp, knobs_and_params(summary)[1]))


def digits_model(summary: Summary) -> torch.nn.Module:
    return digits.SmallCNN(**takes(digits.SmallCNN, knobs_and_params(summary)[1]))


def conv_net(_: object = None) -> torch.nn.Module:
    """A small CNN on `images`: three input channels, so channels-last is a layout of its own (with
    one channel, as in digits, a contiguous batch is channels-last already)."""
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    )


@pytest.fixture(autouse=True)
def restore_threads() -> typing.Iterator[None]:
    """The torch module, Lightning's Trainer and trials set torch's thread count and cuDNN's
    algorithm search for the process; put them back."""
    threads, benchmark, matmul = (
        torch.get_num_threads(),
        torch.backends.cudnn.benchmark,
        torch.get_float32_matmul_precision(),
    )
    finer = fp32_precisions() if hasattr(torch.backends, "fp32_precision") else {}
    yield
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark = benchmark
    if torch.get_float32_matmul_precision() != matmul:  # an exported module sets it
        torch.set_float32_matmul_precision(matmul)
    for name, value in finer.items():
        (
            operator.attrgetter(name)(torch.backends) if name else torch.backends
        ).fp32_precision = value


def notes_by_setting(export: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    named: dict[str, list[dict[str, Any]]] = {}
    for entry in export["notes"]:
        assert (
            set(entry) == {"setting", "value", "status", "note"}
            and entry["status"] in NOTED
            and entry["note"]
        )
        for setting in entry["setting"].split(", "):
            named.setdefault(setting, []).append(entry)
    return named


# --- lightning -------------------------------------------------------------------------------


class Module(lightning.LightningModule):
    """Trains `net` with the optimizer and scheduler that the export's usage lines build."""

    def __init__(self, net: torch.nn.Module, configure: Callable[[Any], Any]) -> None:
        super().__init__()
        self.net, self.configure, self.lrs = net, configure, []

    def training_step(self, batch: Any, _: int) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(self.net(inputs), targets)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def configure_optimizers(self) -> Any:
        return self.configure(self)


def configure_from_usage(export: Mapping[str, Any], summary: Summary) -> Callable[[Any], Any]:
    """configure_optimizers made of the export's own usage lines; a task's own optimizer factory
    has no import line there, so that one line is the test's."""
    lines = export["usage"]
    body = lines[lines.index("# and in your LightningModule's configure_optimizers(self):") + 1 :]
    if summary.optimizer != BUILT_IN:
        body = [
            "optimizer = reference_optimizer(summary, self)"
            if line.startswith("optimizer = ")
            else line
            for line in body
        ]
    namespace = {
        "math": math,
        "torch": torch,
        "export": export,
        "summary": summary,
        "reference_optimizer": reference_optimizer,
    }
    exec("def configure_optimizers(self):\n" + "".join(f"    {line}\n" for line in body), namespace)
    return namespace["configure_optimizers"]


def check_lightning(
    text: str, summary: Summary, *, dataset: Dataset, model: torch.nn.Module
) -> None:
    export = json.loads(text)
    knob_values, extras = knobs_and_params(summary)
    precision = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}[
        knob_values["precision"]
    ]
    assert export["trainer"]["precision"] == precision
    assert export["trainer"]["benchmark"] is knob_values["cudnn_benchmark"]
    torch.backends.cudnn.benchmark = not knob_values["cudnn_benchmark"]  # the Trainer must set it
    trainer = lightning.Trainer(
        **export["trainer"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert trainer.precision == precision
    assert trainer.accumulate_grad_batches == knob_values["accumulation_steps"]
    assert trainer.max_epochs == schedule(summary)
    assert type(trainer.accelerator).__name__ == "CPUAccelerator" and trainer.num_devices == 1
    assert torch.backends.cudnn.benchmark is knob_values["cudnn_benchmark"]

    loader = DataLoader(dataset, **export["dataloader"])
    assert loader.batch_size == knob_values["batch_size"] and loader.drop_last
    assert isinstance(loader.sampler, RandomSampler)
    assert loader.num_workers == knob_values["num_workers"]
    assert loader.prefetch_factor == knob_values["prefetch_factor"]
    assert loader.persistent_workers == (knob_values["num_workers"] > 0)
    assert loader.pin_memory == knob_values["pin_memory"]

    optimizer = export["optimizer"]
    assert optimizer["lr"] == knob_values["lr"] and optimizer["factory"] == summary.optimizer
    if summary.optimizer == BUILT_IN:  # the same hyper-parameters as autotune's own SGD
        built = torch.optim.SGD(model.parameters(), **optimizer["init_args"]).param_groups[0]
        assert {k: v for k, v in built.items() if k != "params"} == {
            k: v
            for k, v in reference_optimizer(summary, model).param_groups[0].items()
            if k != "params"
        }
    assert export["params"] == extras

    named = notes_by_setting(export)
    for knob in (
        "batch_size",
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "lr",
        "scheduler",
        "channels_last",
        "compile",
        "tf32",
        "fused_optimizer",
        "checkpointing",
        *extras,
    ):
        assert knob in named, f"no note says where {knob} went"
    assert ("accumulation_steps" in named) == (knob_values["accumulation_steps"] > 1)
    check_lightning_model_lines(export, knob_values, named)

    module = Module(model, configure_from_usage(export, summary))
    trainer.fit(module, loader)
    total = trainer.estimated_stepping_batches
    assert trainer.global_step == total == len(module.lrs)
    config = trainer.lr_scheduler_configs[0]
    assert config.interval == "step" and config.frequency == 1
    assert module.lrs == pytest.approx(reference_lrs(summary, total), rel=1e-9, abs=1e-12)


def check_lightning_model_lines(
    export: Mapping[str, Any],
    knob_values: Mapping[str, Any],
    named: Mapping[str, list[dict[str, Any]]],
) -> None:
    """channels_last and compile, which the Trainer cannot take: a note whatever the value, saying
    what to do when true, and usage lines that make the model the trial's prepare_model made."""
    for knob, code in (
        ("channels_last", "model = model.to(memory_format=torch.channels_last)"),
        ("compile", "model = torch.compile(model)"),
    ):
        (entry,) = named[knob]
        assert entry["status"] == "no equivalent" and entry["value"] is knob_values[knob]
        assert (code in entry["note"]) is knob_values[knob]
        assert any(line.startswith(code) for line in export["usage"]) is knob_values[knob]
    assert ("on_after_batch_transfer" in named["channels_last"][0]["note"]) is knob_values[
        "channels_last"
    ]

    lines = [line for line in export["usage"] if line.startswith("model = ")]
    namespace: dict[str, Any] = {"torch": torch, "model": conv_net()}
    # lazy: torch.compile compiles at the first call, which never comes
    exec("\n".join(lines), namespace)
    expected, _ = systems.prepare_model(
        conv_net(), channels_last=knob_values["channels_last"], compile=knob_values["compile"]
    )
    made = namespace["model"]
    assert (
        type(made) is type(expected) and (type(made) is OptimizedModule) is knob_values["compile"]
    )
    assert [p.stride() for p in made.parameters()] == [p.stride() for p in expected.parameters()]


@pytest.mark.parametrize("name", CASES)
def test_lightning_builds_the_trainer_loader_and_schedule(name: str) -> None:
    summary = case(name)
    check_lightning(
        render(summary, "lightning"), summary, dataset=_blobs(104, 0), model=blobs_model(summary)
    )


def test_lightning_fp16_is_autocast_to_float16_with_a_grad_scaler() -> None:
    """Lightning refuses 16-mixed on a CPU trainer, so the plugin it maps to is checked alone."""
    summary = summary_for({**knobs(0.1, "cosine", 32, 1, 0, "fp16"), "width": 8}, device="cuda")
    export = json.loads(render(summary, "lightning"))
    assert export["trainer"]["accelerator"] == "gpu" and export["trainer"][
        "precision"
    ] in typing.get_args(_PRECISION_INPUT_STR)
    plugin = MixedPrecision(export["trainer"]["precision"], device="cpu")
    assert plugin.scaler is not None
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16


def test_lightning_says_what_to_do_with_a_fractional_epoch_count() -> None:
    summary = summary_for(
        knobs(0.1, "cosine", 32, 2, 0, "fp32"), max_epochs=2.5, device=None, optimizer=None
    )
    export = json.loads(render(summary, "lightning"))
    assert "max_epochs" not in export["trainer"] and "accelerator" not in export["trainer"]
    named = notes_by_setting(export)
    assert "max_steps=floor(2.5 * len(train_dataloader) / 2)" in named["max_epochs"][0]["note"]
    assert named["device"][0]["status"] == named["optimizer"][0]["status"] == "no equivalent"
    lightning.Trainer(**export["trainer"], logger=False, enable_checkpointing=False)  # still splats


def test_every_format_takes_the_winners_schedule_length_over_the_studys_max_epochs() -> None:
    """A fixed_schedule winner trains 2 epochs of a study whose max_epochs is 3: every export
    schedules 2, and the torch module holds no separate SCHEDULE_EPOCHS constant."""
    summary = summary_for(
        {**knobs(0.1, "cosine", 32, 1, 0, "fp32"), "schedule_epochs": 2.0}, max_epochs=3
    )
    assert json.loads(render(summary, "lightning"))["trainer"]["max_epochs"] == 2
    assert json.loads(render(summary, "hf"))["training_arguments"]["num_train_epochs"] == 2
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(compile(render(summary, "torch"), "exported.py", "exec"), namespace)
    assert namespace["MAX_EPOCHS"] == 2 and "SCHEDULE_EPOCHS" not in namespace


# --- transformers ----------------------------------------------------------------------------


def check_hf(
    text: str, summary: Summary, *, dataset: Dataset, model: torch.nn.Module, tmp_path: Path
) -> None:
    export = json.loads(text)
    knob_values, extras = knobs_and_params(summary)
    given = export["training_arguments"]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), report_to="none", **given
    )
    for key, value in given.items():  # every value arrived
        assert getattr(getattr(args, key), "value", getattr(args, key)) == value, key
    assert args.per_device_train_batch_size == knob_values["batch_size"]
    assert args.gradient_accumulation_steps == knob_values["accumulation_steps"]
    assert args.learning_rate == knob_values["lr"] and args.num_train_epochs == schedule(summary)
    assert (args.fp16, args.bf16) == (
        knob_values["precision"] == "fp16",
        knob_values["precision"] == "bf16",
    )
    assert args.use_cpu and args.max_grad_norm == 0  # autotune never clips gradients
    assert (
        args.dataloader_num_workers,
        args.dataloader_prefetch_factor,
        args.dataloader_pin_memory,
    ) == (knob_values["num_workers"], knob_values["prefetch_factor"], knob_values["pin_memory"])

    hf_trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
    loader = hf_trainer.get_train_dataloader()
    assert (
        loader.batch_sampler.batch_size == knob_values["batch_size"]
        and loader.batch_sampler.drop_last
    )
    assert len(loader) == len(dataset) // knob_values["batch_size"]
    assert (
        loader.num_workers,
        loader.prefetch_factor,
        loader.pin_memory,
        loader.persistent_workers,
    ) == (
        knob_values["num_workers"],
        knob_values["prefetch_factor"],
        knob_values["pin_memory"],
        knob_values["num_workers"] > 0,
    )

    total = 40
    hf_trainer.create_optimizer_and_scheduler(num_training_steps=total)
    group = hf_trainer.optimizer.param_groups[0]
    named = notes_by_setting(export)
    if summary.optimizer == BUILT_IN:
        expected = reference_optimizer(summary, model).param_groups[0]
        assert isinstance(hf_trainer.optimizer, torch.optim.SGD)
        assert (
            group["initial_lr"],
            group["momentum"],
            group["nesterov"],
            group["weight_decay"],
        ) == (expected["lr"], expected["momentum"], expected["nesterov"], expected["weight_decay"])
        # HF spares biases from weight decay
        assert named["optimizer"][0]["status"] == "approximation"
        assert export["params"] == extras
        # HF's sgd has no fused step: said
        assert ("fused_optimizer" in named) is knob_values["fused_optimizer"]
        if knob_values["fused_optimizer"]:
            assert (
                named["fused_optimizer"][0]["status"] == "no equivalent"
                and "fused=True" in named["fused_optimizer"][0]["note"]
            )
    else:
        # HF cannot build the task's own optimizer; its parameters that HF's optimizer takes go
        # there
        assert (
            named["optimizer"][0]["status"] == "no equivalent"
            and summary.optimizer.replace(":", ".") in named["optimizer"][0]["note"]
        )
        moved = {k: v for k, v in extras.items() if k == "weight_decay"}
        assert {k: getattr(args, k) for k in moved} == moved and export["params"] == {
            k: v for k, v in extras.items() if k not in moved
        }
    for name in export["params"]:
        assert name in named
    check_hf_systems(args, knob_values, named)

    lrs = []
    for _ in range(total):
        lrs.append(hf_trainer.optimizer.param_groups[0]["lr"])
        hf_trainer.optimizer.step()
        hf_trainer.lr_scheduler.step()
    reference = reference_lrs(summary, total)
    scheduler = knob_values["scheduler"]
    if scheduler in ("constant", "cosine"):  # the same schedule
        assert lrs == pytest.approx(reference, rel=1e-9, abs=1e-12) and scheduler not in named
    elif (
        scheduler == "onecycle"
    ):  # warm-up over the same quarter, the same peak, then down to (nearly) zero
        warm = math.ceil(0.25 * total)
        assert (
            lrs[warm] == pytest.approx(max(reference))
            and reference.index(max(reference)) == warm - 1
        )
        assert (
            named["scheduler"][0]["status"] == "approximation"
            and "OneCycleLR" in named["scheduler"][0]["note"]
        )
    else:  # no multi-step schedule in HF: said, not dropped
        assert "lr_scheduler_type" not in given
        assert (
            named["scheduler"][0]["status"] == "no equivalent"
            and "MultiStepLR" in named["scheduler"][0]["note"]
        )


def check_hf_systems(
    args: transformers.TrainingArguments,
    knob_values: Mapping[str, Any],
    named: Mapping[str, list[dict[str, Any]]],
) -> None:
    """compile is torch_compile; channels_last and cudnn_benchmark, which have no field, a note each
    whatever the value; the TF32 that torch_compile turns on without fp16, a note saying how to undo
    it."""
    assert args.torch_compile is knob_values["compile"]
    assert (
        args.torch_compile_backend == ("inductor" if knob_values["compile"] else None)
        and args.torch_compile_mode is None
    )
    for knob, code in (
        ("channels_last", "model = model.to(memory_format=torch.channels_last)"),
        ("cudnn_benchmark", "torch.backends.cudnn.benchmark = True"),
    ):
        (entry,) = named[knob]
        assert entry["status"] == "no equivalent" and entry["value"] is knob_values[knob]
        assert (code in entry["note"]) is knob_values[knob]
    # activation checkpointing, non-reentrant as autotune's; a note whatever the value
    on = bool(knob_values["checkpointing"])
    assert args.activation_checkpointing is on
    assert args.activation_checkpointing_kwargs == ({"use_reentrant": False} if on else None)
    (entry,) = named["checkpointing"]
    assert entry["status"] == ("approximation" if on else "moved")
    assert ("autotune.train.checkpointing.apply(model" in entry["note"]) is on
    # None: transformers leaves torch's setting alone
    assert args.tf32 is (True if knob_values["tf32"] else None)
    # given when on; left out when off, which keeps torch's default as the trial did
    assert "tf32" not in named
    tf32 = knob_values["compile"] and knob_values["precision"] != "fp16" and not knob_values["tf32"]
    assert ("compile" in named) is tf32
    if tf32:
        assert named["compile"][0]["status"] == "approximation"
        assert "torch.backends.fp32_precision = 'none'" in named["compile"][0]["note"]


@pytest.mark.parametrize("name", CASES)
def test_hf_training_arguments_take_every_value(name: str, tmp_path: Path) -> None:
    summary = case(name)
    check_hf(
        render(summary, "hf"),
        summary,
        dataset=_blobs(104, 0),
        model=blobs_model(summary),
        tmp_path=tmp_path,
    )


def test_hf_fp16_on_cuda_is_fp16_without_use_cpu(tmp_path: Path) -> None:
    summary = summary_for(knobs(0.1, "constant", 32, 1, 0, "fp16"), device="cuda")
    given = json.loads(render(summary, "hf"))["training_arguments"]
    assert given["fp16"] is True and given["bf16"] is False and "use_cpu" not in given
    bf16 = json.loads(
        render(summary_for(knobs(0.1, "constant", 32, 1, 0, "bf16"), device=None), "hf")
    )
    assert (
        "use_cpu" not in bf16["training_arguments"]
        and "use_cpu=True" in notes_by_setting(bf16)["device"][0]["note"]
    )


# torch's float32 precision settings (torch 2.9+), the generic one first: setting it may change the
# others.
FP32_PRECISIONS = ("", "cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul")


def fp32_precisions() -> dict[str, str]:
    return {
        name: operator.attrgetter(f"{name}.fp32_precision" if name else "fp32_precision")(
            torch.backends
        )
        for name in FP32_PRECISIONS
    }


@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"),
    reason="torch before 2.9 has only the allow_tf32 flags",
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hf_compile_note_undoes_the_tf32_that_transformers_turns_on(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU with TF32, transformers turns float32 matmuls to TF32 when it builds
    TrainingArguments(torch_compile=True) without fp16, and accelerate again when it builds the
    Trainer's state for fp32 on CUDA; the note's line puts torch's defaults back. On CPU,
    transformers is told TF32 is there and accelerate's line (accelerate/state.py) is run as it
    is."""
    monkeypatch.setattr(transformers.training_args, "is_torch_tf32_available", lambda: True)
    # transformers switches it once per process and value
    transformers.training_args.enable_tf32.cache_clear()
    export = json.loads(
        render(summary_for(knobs(0.1, "constant", 32, 1, 0, precision, compile=True)), "hf")
    )
    (entry,) = notes_by_setting(export)["compile"]
    fix = re.search(
        r"torch\.backends\.fp32_precision = 'none'; "
        r"torch\.set_float32_matmul_precision\('highest'\)",
        entry["note"],
    ).group()
    default, matmul = fp32_precisions(), torch.get_float32_matmul_precision()
    try:
        transformers.TrainingArguments(
            output_dir=str(tmp_path), report_to="none", **export["training_arguments"]
        )
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        if precision == "fp32":
            torch.backends.cuda.matmul.allow_tf32 = (
                True  # accelerate's AcceleratorState: a dynamo backend, no mixed precision
            )
        exec(fix, {"torch": torch})
        now = fp32_precisions()
        # full-precision float32 matmuls, torch's default
        assert torch.get_float32_matmul_precision() == "highest"
        assert now.pop("cuda.matmul") in ("none", "ieee") and now.pop("mkldnn.matmul") in (
            "none",
            "ieee",
        )
        # cuDNN convolutions in TF32 as before
        assert now == {k: v for k, v in default.items() if not k.endswith("matmul")}
    finally:
        torch.set_float32_matmul_precision(matmul)
        for name, value in default.items():
            (
                operator.attrgetter(name)(torch.backends) if name else torch.backends
            ).fp32_precision = value
        transformers.training_args.enable_tf32.cache_clear()
    assert fp32_precisions() == default


def test_tf32_is_carried_by_every_format() -> None:
    """A winner with TF32 matmuls: HF's tf32 field (and no note undoing the TF32 that torch_compile
    brings), Lightning's usage line and note, the torch module's own setting, which trains as the
    trial did."""
    summary = summary_for(
        knobs(0.1, "constant", 16, 1, 0, "fp32", compile=True, tf32=True), device="cuda"
    )
    hf = json.loads(render(summary, "hf"))
    assert hf["training_arguments"]["tf32"] is True and not {"tf32", "compile"} & set(
        notes_by_setting(hf)
    )
    lightning_export = json.loads(render(summary, "lightning"))
    assert (
        "torch.set_float32_matmul_precision('high')  "
        "# TF32 tensor cores for float32 matrix products" in lightning_export["usage"]
    )
    assert (
        "set_float32_matmul_precision('high')"
        in notes_by_setting(lightning_export)["tf32"][0]["note"]
    )
    on_cpu = summary_for(knobs(0.1, "constant", 16, 1, 0, "fp32", tf32=True))
    check_torch(render(on_cpu, "torch"), on_cpu, dataset=_blobs(104, 0), model_factory=blobs_model)


@pytest.mark.parametrize("value", [True, 0.5])
def test_checkpointing_is_carried_by_every_format(value: bool | float, tmp_path: Path) -> None:
    """HF's gradient_checkpointing (non-reentrant) with a note on what it checkpoints; Lightning's
    usage line, which checkpoints what the trial did; the torch module, which trains as the trial
    did with the same blocks checkpointed; the flags."""
    summary = summary_for(knobs(0.05, "cosine", 16, 2, 0, "fp32", checkpointing=value))
    check_hf(
        render(summary, "hf"),
        summary,
        dataset=_blobs(104, 0),
        model=ActivationBudgetNet(),
        tmp_path=tmp_path,
    )
    export = json.loads(render(summary, "lightning"))
    (line,) = [u for u in export["usage"] if u.startswith("autotune.train.checkpointing.apply")]
    namespace: dict[str, Any] = {"autotune": __import__("autotune.train.checkpointing")}
    namespace["model"] = model = ActivationBudgetNet()
    exec(line, namespace)
    expected, _ = systems.prepare_model(
        ActivationBudgetNet(), channels_last=False, compile=False, checkpointing=value
    )
    assert len(checkpointing.checkpointed(model)) == len(checkpointing.checkpointed(expected))
    assert len(checkpointing.checkpointed(model)) == (6 if value is True else 3)
    check_lightning(
        render(summary, "lightning"), summary, dataset=_blobs(104, 0), model=ActivationBudgetNet()
    )
    check_torch(
        render(summary, "torch"),
        summary,
        dataset=_blobs(104, 0),
        model_factory=lambda _: ActivationBudgetNet(),
    )
    check_args(render(summary, "args"), summary.best.params)


def test_hf_compile_with_fp16_leaves_tf32_alone() -> None:
    """transformers turns TF32 on with torch_compile only without fp16: no note then."""
    export = json.loads(
        render(
            summary_for(knobs(0.1, "constant", 32, 1, 0, "fp16", compile=True), device="cuda"), "hf"
        )
    )
    assert export["training_arguments"][
        "torch_compile"
    ] is True and "compile" not in notes_by_setting(export)


# --- torch -----------------------------------------------------------------------------------


def check_torch(
    code: str,
    summary: Summary,
    *,
    dataset: Dataset,
    model_factory: Callable[[Mapping[str, Any]], torch.nn.Module],
    steps: int = 3,
    gather: Callable[..., Any] | None = None,
) -> None:
    """exec the module, check what make_training built, and train `steps` steps beside
    autotune.train.trial (with data_on_device, gathering batches with `gather`, a task's)."""
    knob_values, extras = knobs_and_params(summary)
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(compile(code, "exported.py", "exec"), namespace)
    assert namespace["PARAMS"] == extras and namespace["MAX_EPOCHS"] == schedule(summary)
    torch.manual_seed(0)
    model = model_factory(summary)
    twin = copy.deepcopy(model)
    torch.backends.cudnn.benchmark = not knob_values["cudnn_benchmark"]  # make_training must set it
    torch.set_float32_matmul_precision("high" if not knob_values["tf32"] else "highest")  # and this
    training = namespace["make_training"](model, dataset, device="cpu", seed=0, gather=gather)
    assert torch.backends.cudnn.benchmark is knob_values["cudnn_benchmark"]
    assert torch.get_float32_matmul_precision() == ("high" if knob_values["tf32"] else "highest")

    # The model the trial trains: channels-last weights where it asks, compiled where it asks, and
    # the uncompiled module beside it with the same parameters.
    twin, _ = systems.prepare_model(
        twin,
        channels_last=knob_values["channels_last"],
        compile=False,
        checkpointing=knob_values["checkpointing"],
    )
    assert training.module is model
    assert [id(b) for b in checkpointing.checkpointed(model)] == [
        id(b) for b in model.modules() if b in checkpointing.checkpointed(model)
    ]
    assert len(checkpointing.checkpointed(model)) == len(checkpointing.checkpointed(twin))
    assert [p.stride() for p in model.parameters()] == [p.stride() for p in twin.parameters()]
    if knob_values["compile"]:
        assert isinstance(training.model, OptimizedModule) and training.model._orig_mod is model
        training.model = (
            model  # compiling a step takes ~16 s on a CPU; the compiled module computes the same
        )
    else:
        assert training.model is model

    loader = training.loader
    on_device = knob_values["data_on_device"]
    assert isinstance(loader, DataLoader) is not on_device
    # each epoch's, as the trial's EpochBatches makes them
    batches = (loader.batches if on_device else loader.batch_sampler).batches
    assert (
        batches.batch_size == knob_values["batch_size"]
        and batches.drop_last
        and isinstance(batches.sampler, RandomSampler)
    )
    if not on_device:
        assert (
            loader.num_workers == knob_values["num_workers"]
            and loader.prefetch_factor == knob_values["prefetch_factor"]
        )
        assert loader.persistent_workers == (knob_values["num_workers"] > 0)
        assert loader.pin_memory is False

    optimizer = reference_optimizer(summary, twin)
    total = max(1, math.floor(schedule(summary) * len(loader) / knob_values["accumulation_steps"]))
    assert training.total_steps == total
    scheduler = make_scheduler(
        knob_values["scheduler"], optimizer, total_steps=total, lr=knob_values["lr"]
    )
    assert type(training.optimizer) is type(optimizer) and type(training.scheduler) is type(
        scheduler
    )
    assert [
        {k: v for k, v in g.items() if k != "params"}
        for g in training.optimizer.param_groups
        # lr, momentum, decay, ...
    ] == [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    precision = knob_values["precision"]
    assert training.scaler.is_enabled() == (precision == "fp16")
    with training.autocast():
        assert torch.is_autocast_enabled("cpu") == (precision != "fp32")
        if precision != "fp32":
            assert torch.get_autocast_dtype("cpu") == DTYPES[precision]

    autocast = functools.partial(
        torch.autocast, "cpu", dtype=DTYPES[precision], enabled=precision != "fp32"
    )
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    batches = training.batches
    # the strides of the inputs each model sees
    layouts: dict[str, list[tuple[int, ...]]] = {
        "mine": [],
        "trial's": [],
    }
    for who, net in (("mine", model), ("trial's", twin)):
        net.register_forward_pre_hook(
            lambda _, args, who=who: layouts[who].append(args[0].stride())
        )
    for step in range(steps):  # the same micro-batches (and dropout masks) through both train steps
        group = list(itertools.islice(batches, knob_values["accumulation_steps"]))
        training.batches = iter(group)
        torch.manual_seed(step)
        namespace["train_step"](training, loss_fn=F.cross_entropy)
        torch.manual_seed(step)
        train_step(
            twin,
            group,
            loss_fn=F.cross_entropy,
            optimizer=optimizer,
            scaler=scaler,
            autocast=autocast,
            device=torch.device("cpu"),
            non_blocking=False,
            channels_last=knob_values["channels_last"],
        )
        scheduler.step()
        for mine, theirs in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(mine, theirs)
        assert training.scheduler.get_last_lr() == pytest.approx(scheduler.get_last_lr(), rel=1e-12)
    assert (
        layouts["mine"] == layouts["trial's"]
        and len(layouts["mine"]) == steps * knob_values["accumulation_steps"]
    )
    assert any(
        not torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), model_factory(summary).state_dict().values())
    )
    for _ in range(total - steps):  # the rest of the schedule, without training
        training.scheduler.step()
        scheduler.step()
        assert training.scheduler.get_last_lr() == pytest.approx(
            scheduler.get_last_lr(), rel=1e-9, abs=1e-12
        )
    del training, batches  # let persistent loader workers go


@pytest.mark.parametrize("name", CASES)
def test_torch_module_trains_as_the_trial_did(name: str) -> None:
    summary = case(name)
    check_torch(
        render(summary, "torch"), summary, dataset=_blobs(104, 0), model_factory=blobs_model
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_module_loads_the_batches_the_trial_loaded(num_workers: int) -> None:
    """The same seed, the same micro-batches epoch after epoch, from one loader iterator whose
    workers run on across each epoch's end, as the trial's (autotune.train.loader)."""
    summary = summary_for(knobs(0.05, "constant", 16, 1, num_workers, "fp32"))
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(render(summary, "torch"), namespace)
    dataset = _blobs(104, 0)  # 6 batches of 16 an epoch, 8 samples dropped
    training = namespace["make_training"](blobs_model(summary), dataset, device="cpu", seed=5)
    mine = [x for x, _ in itertools.islice(training.batches, 3 * 6)]
    config = TrialConfig.from_mapping(summary.best.params)
    loader = make_loader(dataset, config, seed=5, device=torch.device("cpu"))
    theirs = [x for x, _ in itertools.islice(endless(loader), 3 * 6)]
    assert len(training.loader) == len(loader) == 6
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert not torch.equal(mine[0], mine[6])  # each epoch shuffled afresh
    training.batches.close()


@pytest.mark.parametrize("accumulation_steps, precision", [(1, "fp32"), (2, "bf16")])
def test_torch_module_lays_out_a_cnn_channels_last_as_the_trial_did(
    accumulation_steps: int, precision: str
) -> None:
    summary = summary_for(
        knobs(
            0.05,
            "cosine",
            8,
            accumulation_steps,
            0,
            precision,
            channels_last=True,
            cudnn_benchmark=True,
        )
    )
    check_torch(render(summary, "torch"), summary, dataset=images(64, 0), model_factory=conv_net)
    namespace: dict[str, Any] = {}
    exec(render(summary, "torch"), namespace)
    assert namespace["to_device"](torch.ones(2, 3, 4, 4), "cpu").is_contiguous(
        memory_format=torch.channels_last
    )
    assert namespace["to_device"](
        torch.ones(2, 3, 4), "cpu"
    ).is_contiguous()  # not an image batch: as it is


def test_torch_module_compiles_a_cnn_and_keeps_the_module_uncompiled() -> None:
    summary = summary_for(knobs(0.05, "step", 8, 1, 0, "fp32", channels_last=True, compile=True))
    check_torch(
        render(summary, "torch"), summary, dataset=images(64, 0), model_factory=conv_net, steps=2
    )


def test_torch_module_without_a_recorded_optimizer_asks_for_one() -> None:
    summary = summary_for(
        {**knobs(0.1, "cosine", 16, 1, 0, "fp32"), "width": 8}, optimizer=None, max_epochs=None
    )
    namespace: dict[str, Any] = {}
    exec(render(summary, "torch"), namespace)
    model = blobs_model(summary)
    with pytest.raises(ValueError, match="max_epochs"):
        namespace["make_training"](model, _blobs(64, 0), device="cpu")
    with pytest.raises(NotImplementedError, match="make_optimizer="):
        namespace["make_training"](model, _blobs(64, 0), device="cpu", max_epochs=1)
    training = namespace["make_training"](
        model,
        _blobs(64, 0),
        device="cpu",
        max_epochs=1,
        make_optimizer=lambda parameters, lr: torch.optim.SGD(parameters, lr=lr),
    )
    namespace["train_step"](training, loss_fn=F.cross_entropy)
    assert training.scheduler.last_epoch == 1


def test_torch_export_refuses_an_optimizer_that_cannot_be_imported() -> None:
    summary = summary_for(knobs(0.1, "cosine", 16, 1, 0, "fp32"), optimizer="my tasks:make-opt")
    with pytest.raises(AutotuneError, match="not an importable module:qualname"):
        render(summary, "torch")


# --- the LR schedule over any run length ------------------------------------------------------

# OneCycleLR's warm-up is stretched to 1.5 steps up to 5 steps, and 1 step has no cycle: every
# export must schedule such short runs as the trial does, as well as long ones.
TOTALS = (1, 2, 3, 4, 5, 8, 100)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_torch_module_schedules_every_run_length_as_the_trial_does(scheduler: str) -> None:
    summary = summary_for(knobs(0.1, scheduler, 8, 1, 0, "fp32"))
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(render(summary, "torch"), namespace)
    for total in TOTALS:  # one batch per epoch: as many optimizer steps as epochs
        training = namespace["make_training"](
            torch.nn.Linear(8, 4), _blobs(8, 0), device="cpu", max_epochs=total
        )
        assert training.total_steps == total
        assert lrs_of(training.optimizer, training.scheduler, total) == reference_lrs(
            summary, total
        ), total


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_lightning_schedules_every_run_length_as_the_trial_does(scheduler: str) -> None:
    summary = summary_for(knobs(0.1, scheduler, 1, 1, 0, "fp32"), max_epochs=1)
    export = json.loads(render(summary, "lightning"))
    for total in TOTALS:  # one epoch of `total` batches of one
        trainer = lightning.Trainer(
            **export["trainer"],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        module = Module(torch.nn.Linear(8, 4), configure_from_usage(export, summary))
        trainer.fit(module, DataLoader(_blobs(total, 0), **export["dataloader"]))
        assert trainer.estimated_stepping_batches == total
        assert module.lrs == pytest.approx(reference_lrs(summary, total), rel=1e-12, abs=1e-15), (
            total
        )


def hf_trainer_class(export: Mapping[str, Any]) -> type[transformers.Trainer]:
    """transformers.Trainer, or the subclass the scheduler's note says to write where HF has no
    schedule of autotune's (step) or only an approximation (onecycle), made of the note's own
    code."""
    named = notes_by_setting(export)
    if "scheduler" not in named:
        return transformers.Trainer
    match = re.search(
        r"override (create_scheduler\(self, num_training_steps, optimizer=None\)) "
        r"to set and return "
        r"(self\.lr_scheduler = .*)\.$",
        named["scheduler"][0]["note"],
    )
    namespace: dict[str, Any] = {"torch": torch, "math": math}
    exec(f"def {match.group(1)}:\n    {match.group(2)}\n    return self.lr_scheduler", namespace)
    return type(
        "Exact", (transformers.Trainer,), {"create_scheduler": namespace["create_scheduler"]}
    )


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_hf_schedules_every_run_length_as_the_trial_does(scheduler: str, tmp_path: Path) -> None:
    summary = summary_for(knobs(0.1, scheduler, 8, 1, 0, "fp32"))
    export = json.loads(render(summary, "hf"))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), report_to="none", **export["training_arguments"]
    )
    hf_trainer = hf_trainer_class(export)(
        model=torch.nn.Linear(8, 4), args=args, train_dataset=_blobs(8, 0)
    )
    for total in TOTALS:
        hf_trainer.optimizer = hf_trainer.lr_scheduler = None
        hf_trainer.create_optimizer_and_scheduler(num_training_steps=total)
        assert lrs_of(hf_trainer.optimizer, hf_trainer.lr_scheduler, total) == pytest.approx(
            reference_lrs(summary, total), rel=1e-9, abs=1e-12
        ), total


def test_every_format_knows_the_built_in_sgd_by_the_name_older_studies_stored() -> None:
    """Studies stored before the tasks moved recorded it as autotune.tasks:sgd: still the built-in
    SGD, written out in every format (not imported from a module that is gone), the stored name
    kept."""
    params = {**knobs(0.05, "cosine", 16, 1, 0, "fp32"), "width": 8}
    old, new = (
        summary_for(params, optimizer=STORED_BUILT_IN),
        summary_for(params, optimizer=BUILT_IN),
    )
    for fmt in RENDERERS:
        assert render(old, fmt) == render(new, fmt).replace(BUILT_IN, STORED_BUILT_IN), fmt
    assert json.loads(render(old, "lightning"))["optimizer"]["class_path"] == "torch.optim.SGD"
    assert json.loads(render(old, "hf"))["training_arguments"]["optim"] == "sgd"
    check_torch(
        render(old, "torch"), old, dataset=_blobs(64, 0), model_factory=blobs_model, steps=1
    )


def test_every_precision_has_a_name_each_trainer_takes(tmp_path: Path) -> None:
    """The precision table's trainer names: Lightning's precision strings and TrainingArguments'
    flags."""
    for name, precision in PRECISIONS.items():
        assert precision.lightning in typing.get_args(_PRECISION_INPUT_STR), name
        assert precision.hf is None or precision.hf in {
            f.name for f in dataclasses.fields(transformers.TrainingArguments)
        }, name


# --- args ------------------------------------------------------------------------------------


def parser_for(params: Mapping[str, Any]) -> argparse.ArgumentParser:
    """The parser a training script would have for these settings."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for name, value in params.items():
        flag = "--" + name.replace("_", "-")
        if name == "pin_memory" or isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, required=True)
        elif name == "prefetch_factor":
            parser.add_argument(flag, type=int, default=None)
        else:
            parser.add_argument(flag, type=type(value), required=True)
    return parser


def check_args(line: str, params: Mapping[str, Any]) -> None:
    assert line.endswith("\n") and line.count("\n") == 1
    words = shlex.split(line)
    assert ("--prefetch-factor" in words) == (params["prefetch_factor"] is not None)
    parsed = vars(parser_for(params).parse_args(words))
    assert parsed == dict(params)
    assert all(type(parsed[k]) is type(v) for k, v in params.items())


@pytest.mark.parametrize("name", CASES)
def test_args_parse_back_to_the_settings(name: str) -> None:
    summary = case(name)
    check_args(render(summary, "args"), summary.best.params)


def test_args_quote_and_attach_what_a_shell_or_argparse_would_misread() -> None:
    params = {
        **knobs(1e-05, "cosine", 64, 2, 2, "bf16"),
        "pin_memory": True,
        "label": "two words; rm -rf /",
        "tag": "-x",
        "offset": -0.5,
        "fused": False,
        "depth": 3,
        "ratio": 0.1 + 0.2,
    }
    line = render(summary_for(params), "args")
    assert (
        "--pin-memory" in line.split()
        and "--no-fused" in line.split()
        and "--tag=-x" in line.split()
    )
    check_args(line, params)


# --- a study stored before the systems knobs ------------------------------------------------


def test_a_winner_with_its_data_on_the_device_gathers_its_batches_there_in_every_format() -> None:
    """The torch module makes no DataLoader: a TensorDataset's tensors indexed (or the task's own
    gather), trained as the trial's step trains; another dataset without a gather is refused.
    Lightning and HF say so in a note."""
    params = {**knobs(0.05, "cosine", 16, 2, 0, "fp32"), "data_on_device": True}
    summary = summary_for(params)
    code = render(summary, "torch")
    assert "DATA_ON_DEVICE = True" in code
    check_torch(code, summary, dataset=_blobs(64, 0), model_factory=blobs_model, steps=2)
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(compile(code, "exported.py", "exec"), namespace)
    digits_train = digits.task().train
    with pytest.raises(TypeError, match="pass make_training\\(gather=\\)"):
        namespace["make_training"](blobs_model(summary), digits_train, device="cpu")
    for fmt in ("lightning", "hf"):
        (note,) = [
            n
            for n in yaml.safe_load(render(summary, fmt))["notes"]
            if n["setting"] == "data_on_device"
        ]
        assert note["value"] is True and "copy your training tensors to the device" in note["note"]
    check_args(render(summary, "args"), params)


def test_a_winner_stored_before_the_systems_knobs_ran_without_them(tmp_path: Path) -> None:
    """Its params lack channels_last, compile and cudnn_benchmark (a trial record may hold None
    instead): every format writes them false, as its trials ran; a knob with nothing to assume in
    its place is still an error."""
    ran = {**knobs(0.05, "cosine", 16, 2, 0, "bf16"), "width": 8}  # the systems knobs false
    stored = {k: v for k, v in ran.items() if k not in SYSTEMS}
    summary = summary_for(stored)
    assert json.loads(render(summary, "json")) == ran
    # the knobs in order, then params
    assert list(yaml.safe_load(render(summary, "yaml")).items()) == list(ran.items())
    check_args(render(summary, "args"), ran)
    check_lightning(
        render(summary, "lightning"), summary, dataset=_blobs(64, 0), model=blobs_model(summary)
    )
    check_hf(
        render(summary, "hf"),
        summary,
        dataset=_blobs(64, 0),
        model=blobs_model(summary),
        tmp_path=tmp_path,
    )
    check_torch(
        render(summary, "torch"), summary, dataset=_blobs(64, 0), model_factory=blobs_model, steps=1
    )
    as_none = summary_for({**stored, **dict.fromkeys(SYSTEMS)})
    for fmt in RENDERERS:
        assert render(as_none, fmt) == render(summary, fmt), fmt
    with pytest.raises(
        AutotuneError,
        match="the winner's settings lack lr, batch_size; the study storage looks damaged",
    ):
        render(
            summary_for({k: v for k, v in stored.items() if k not in ("lr", "batch_size")}), "hf"
        )


# --- the command line and a real study -------------------------------------------------------


def test_the_command_line_lists_every_format_and_refuses_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["export", "--help"])
    assert done.value.code == 0 and "{" + ",".join(FORMATS) + "}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["export", "study.yaml", "--format", "keras"])
    assert done.value.code == 2 and "invalid choice: 'keras'" in capsys.readouterr().err
    with pytest.raises(
        AutotuneError, match="expected one of yaml, json, lightning, hf, torch, args"
    ):
        render(case("constant-fp32"), "keras")


def test_every_format_for_a_real_digits_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    study = {
        "task": "digits",
        "target": {"metric": "accuracy", "value": 0.5},
        "space": {
            "lr": {"low": 0.02, "high": 0.1, "log": True},
            "scheduler": ["onecycle", "cosine"],
            "batch_size": [32, 64],
            "accumulation_steps": [1, 2],
            "num_workers": 0,
            "pin_memory": False,
            "precision": ["fp32", "bf16"],
            "channels_last": True,
            "params": {"width": [8, 16]},
        },
        "budget": {"trials": 2, "max_epochs": 2, "max_seconds": 10, "eval_every": 0.25},
        # no confirmation: the baseline (channels_last off) could win one fresh seed by noise,
        # and what is exported here is a trial of this space
        "confirm": {"top": 0},
        "seed": 0,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    assert main(["run", str(path)]) == 0
    assert "Winner: " in capsys.readouterr().out
    assert main(["report", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    spec = study_file.load(path)
    summary = of_study(spec, opening.open_study(spec, create=False))[1]
    # --json is the typed summary, as JSON
    assert json.loads(json.dumps(summary.as_dict())) == printed
    params = summary.best.params
    assert (
        # one device: DDP never ran, and neither the report nor an export shows its knobs
        set(params) == {*KNOBS, "width"} - set(DDP_NAMES)
        and summary.optimizer == BUILT_IN
        and summary.device == "cpu"
    )
    assert (params["channels_last"], params["compile"], params["cudnn_benchmark"]) == (
        True,
        False,
        False,
    )

    files = {}
    for fmt in RENDERERS:
        files[fmt] = tmp_path / f"best.{fmt}"
        assert main(["export", str(path), "--format", fmt, "-o", str(files[fmt])]) == 0, (
            capsys.readouterr().err
        )
    # a built-in task has no command line of its own to fill
    assert main(["export", str(path), "--format", "command"]) == 2
    assert "trains a built-in or Python task, not a command" in capsys.readouterr().err
    assert json.loads(files["json"].read_text()) == params
    assert yaml.safe_load(files["yaml"].read_text()) == params
    assert (
        files["yaml"].read_text().startswith(f"# autotune study study, trial {summary.best.trial} ")
    )
    train = digits.task().train
    check_lightning(
        files["lightning"].read_text(), summary, dataset=train, model=digits_model(summary)
    )
    check_hf(
        files["hf"].read_text(),
        summary,
        dataset=train,
        model=digits_model(summary),
        tmp_path=tmp_path,
    )
    check_torch(
        files["torch"].read_text(),
        summary,
        dataset=train,
        model_factory=digits_model,
        steps=2,
        gather=digits.task().device_train(torch.device("cpu")),
    )
    check_args(files["args"].read_text(), params)


@pytest.mark.parametrize(
    ("device", "shown"),
    [
        ("cpu", 'device=torch.device("cpu")'),
        ("cuda", 'device=torch.device("cuda")'),
        (None, 'device=torch.device("cuda")'),
    ],
)
def test_the_torch_modules_usage_names_the_device_the_study_trained_on(
    device: str | None, shown: str
) -> None:
    summary = summary_for(knobs(0.1, "constant", 16, 1, 0, "fp32"), device=device)
    usage = render(summary, "torch").split('"""', 2)[1]
    assert f"training = make_training(model, train_dataset, {shown})" in usage
