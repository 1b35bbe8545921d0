"""A winner trained on several devices (devices_per_trial) in every format: the device count and
the strategy where the trainer takes them, the torchrun line where it does not, and a torch
module that trains under a process group as the trial's ranks did."""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
import torch.distributed as dist
import transformers
import yaml
from lightning.pytorch.strategies import DDPStrategy

from autotune.export import render
from autotune.runners.distributed import free_port
from tests.export.test_export import _blobs, blobs_model, fp32_precisions, knobs, summary_for

TWO = dataclasses.replace(
    summary_for(knobs(0.05, "constant", 16, 2, 0, "fp32")), devices_per_trial=2
)


def notes_about_devices(export: dict[str, Any]) -> list[str]:
    return [n["note"] for n in export["notes"] if n["setting"] == "devices_per_trial"]


def test_one_device_writes_no_device_count_or_strategy() -> None:
    one = dataclasses.replace(TWO, devices_per_trial=1)
    assert "devices_per_trial" not in yaml.safe_load(render(one, "yaml"))
    assert json.loads(render(one, "lightning"))["trainer"]["devices"] == 1
    assert "ddp_backend" not in json.loads(render(one, "hf"))["training_arguments"]
    assert "--nproc-per-node" not in render(one, "torch")


def test_flat_formats_and_provenance_carry_the_device_count() -> None:
    assert yaml.safe_load(render(TWO, "yaml"))["devices_per_trial"] == 2
    assert json.loads(render(TWO, "json"))["devices_per_trial"] == 2
    assert "on 2 devices" in render(TWO, "yaml").splitlines()[0]


def test_lightning_trains_on_two_devices_with_ddp() -> None:
    export = json.loads(render(TWO, "lightning"))
    assert export["trainer"]["devices"] == 2 and export["trainer"]["strategy"] == "ddp"
    trainer = lightning.Trainer(
        **export["trainer"], logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.num_devices == 2
    [text] = notes_about_devices(export)
    assert "per device" in text and "torchrun --standalone --nproc-per-node=2" in text


@pytest.fixture
def process_group() -> Iterator[None]:
    """This process as the only rank of a gloo group, as the exported module runs under torchrun;
    the process-wide settings make_training sets (as the trial did for its run) put back after."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    matmul, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    precisions = fp32_precisions() if hasattr(torch.backends, "fp32_precision") else {}
    try:
        yield
    finally:
        dist.destroy_process_group()
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.benchmark = benchmark
        for name, value in precisions.items():
            (
                operator.attrgetter(name)(torch.backends) if name else torch.backends
            ).fp32_precision = value


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as torchrun launches one of its processes (here the only one); the process
    group and accelerate's state that a Trainer makes of it undone after."""
    from accelerate.state import AcceleratorState, PartialState

    launched = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**launched, "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        AcceleratorState._reset_state(True)
        PartialState._reset_state()


def test_hf_names_the_backend_and_the_launch(tmp_path: Path, one_rank: None) -> None:
    export = json.loads(render(TWO, "hf"))
    assert "torchrun --standalone --nproc-per-node=2" in notes_about_devices(export)[0]
    # the Trainer's state joins the process group with the backend named
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), **export["training_arguments"]
    )
    assert arguments.ddp_backend == "gloo" and arguments.per_device_train_batch_size == 16
    assert dist.is_initialized() and dist.get_backend() == "gloo"


def test_the_torch_module_trains_in_a_process_group_as_a_ranks_trial(process_group: None) -> None:
    source = render(TWO, "torch")
    assert "torchrun --standalone --nproc-per-node=2 your_script.py" in source
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(compile(source, "exported.py", "exec"), namespace)
    model = blobs_model(TWO)
    training = namespace["make_training"](model, _blobs(104, 0), device="cpu", seed=3)
    assert isinstance(training.model, torch.nn.parallel.DistributedDataParallel)
    assert training.module is model  # evaluate and save the unwrapped one
    assert isinstance(
        training.loader.batch_sampler.batches.sampler, torch.utils.data.DistributedSampler
    )
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):  # two micro-batches a step: the first under no_sync
        namespace["train_step"](training, loss_fn=torch.nn.functional.cross_entropy)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


DDP = {"ddp_bucket_cap_mb": 5, "ddp_gradient_as_bucket_view": True, "ddp_static_graph": True}
TUNED = dataclasses.replace(
    TWO, best=dataclasses.replace(TWO.best, params={**TWO.best.params, **DDP})
)


def test_ddp_s_knobs_are_flat_settings_on_several_devices_only() -> None:
    assert {k: yaml.safe_load(render(TUNED, "yaml"))[k] for k in DDP} == DDP
    assert {k: json.loads(render(TUNED, "json"))[k] for k in DDP} == DDP
    words = render(TUNED, "args").split()
    assert "--ddp-bucket-cap-mb" in words and "--ddp-static-graph" in words
    # as the trials ran before the knobs existed: DDP's defaults
    assert yaml.safe_load(render(TWO, "yaml"))["ddp_bucket_cap_mb"] == 25
    one = dataclasses.replace(TUNED, devices_per_trial=1)
    assert not set(DDP) & set(yaml.safe_load(render(one, "yaml")))
    assert "--ddp" not in render(one, "args")
    assert "ddp" not in json.loads(render(one, "lightning"))
    assert not [k for k in json.loads(render(one, "hf"))["training_arguments"] if "bucket" in k]


def test_lightning_keeps_strategy_ddp_at_ddp_s_defaults() -> None:
    export = json.loads(render(TWO, "lightning"))
    assert export["trainer"]["strategy"] == "ddp" and "ddp" not in export
    assert export["usage"][0] == "trainer = lightning.Trainer(**export['trainer'])"


def test_lightning_builds_a_ddp_strategy_with_the_winner_s_knobs() -> None:
    export = json.loads(render(TUNED, "lightning"))
    assert "strategy" not in export["trainer"]
    section = export["ddp"]
    assert section["class_path"] == "lightning.pytorch.strategies.DDPStrategy"
    strategy = DDPStrategy(**section["init_args"])
    # what the strategy hands DistributedDataParallel
    assert strategy._ddp_kwargs == {
        "bucket_cap_mb": 5,
        "gradient_as_bucket_view": True,
        "static_graph": True,
    }
    # the usage line, run as written
    namespace = {"lightning": lightning, "export": export}
    line = export["usage"][0]
    assert "DDPStrategy(**export['ddp']['init_args'])" in line
    exec(line.replace("**export['trainer'],", "**export['trainer'], logger=False,"), namespace)
    trainer = namespace["trainer"]
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.num_devices == 2
    assert trainer.strategy._ddp_kwargs == strategy._ddp_kwargs
    [text] = [n["note"] for n in export["notes"] if n["setting"].startswith("ddp_bucket_cap_mb")]
    assert "`ddp`" in text


def test_hf_carries_two_ddp_fields_and_says_how_to_set_the_third(
    tmp_path: Path, one_rank: None
) -> None:
    export = json.loads(render(TUNED, "hf"))
    arguments = export["training_arguments"]
    assert (arguments["ddp_bucket_cap_mb"], arguments["ddp_static_graph"]) == (5, True)
    [view] = [n for n in export["notes"] if n["setting"] == "ddp_gradient_as_bucket_view"]
    assert view["status"] == "no equivalent" and view["value"] is True
    assert "trainer.accelerator.ddp_handler.gradient_as_bucket_view = True" in view["note"]
    trainer = transformers.Trainer(
        model=blobs_model(TUNED),
        args=transformers.TrainingArguments(output_dir=str(tmp_path), **arguments),
    )
    trainer.accelerator.ddp_handler.gradient_as_bucket_view = True  # as the note says
    # what the Trainer's accelerator hands DistributedDataParallel
    ddp = torch.nn.parallel.DistributedDataParallel(
        blobs_model(TUNED), **trainer.accelerator.ddp_handler.to_kwargs()
    )
    assert ddp.bucket_bytes_cap == 5 * 2**20
    assert ddp.gradient_as_bucket_view is True and ddp.static_graph is True


def test_the_torch_module_wraps_with_the_winner_s_ddp_knobs(process_group: None) -> None:
    source = render(TUNED, "torch")
    assert "DDP_BUCKET_CAP_MB = 5" in source and "static_graph=DDP_STATIC_GRAPH" in source
    namespace: dict[str, Any] = {"__name__": "exported"}
    exec(compile(source, "exported.py", "exec"), namespace)
    training = namespace["make_training"](blobs_model(TUNED), _blobs(104, 0), device="cpu", seed=3)
    assert training.model.bucket_bytes_cap == 5 * 2**20
    assert training.model.gradient_as_bucket_view is True
    assert training.model.static_graph is True
