"""The GPU systems knobs, for what each does in a trial: channels-last memory format of the model's
parameters and of its input batches, a compiled module, cuDNN's search flag set for the trial and
restored after; and where each cannot run, what the study does instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.errors import SpecError
from autotune.runners import isolation
from autotune.search.space import DEFAULT_BASELINE, Choices, complete
from autotune.spec.study_file import load
from autotune.study import preparation
from autotune.train import systems
from autotune.train.config import Limits, TrialConfig
from autotune.train.tasks import Task
from autotune.train.trial import run

CPU = torch.device("cpu")
# accuracy never reaches 2: one epoch
SHORT = Limits(target=2.0, max_epochs=1, max_seconds=60, eval_every=1.0)


class Recorder(nn.Module):
    """A small CNN that notes, for each training forward pass, whether its input and its first
    convolution's weight were channels-last, and cuDNN's benchmark flag."""

    seen: list[tuple[bool, bool, bool]] = []

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not torch.compiler.is_compiling():
            layout = torch.channels_last
            Recorder.seen.append(
                (
                    x.is_contiguous(memory_format=layout),
                    self.conv.weight.is_contiguous(memory_format=layout),
                    torch.backends.cudnn.benchmark,
                )
            )
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def images(n: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=generator)
    return TensorDataset(
        torch.randn(n, 3, 8, 8, generator=generator) + labels[:, None, None, None], labels
    )


def image_task() -> Task:
    return Task(model=Recorder, train=images(), val=images(seed=1))


def config(**knobs: object) -> TrialConfig:
    return TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, "batch_size": 16, **knobs}))


@pytest.fixture(autouse=True)
def fresh_record() -> None:
    Recorder.seen = []


@pytest.mark.parametrize("channels_last", [False, True])
def test_channels_last_lays_out_the_model_and_every_input_batch(channels_last: bool) -> None:
    run(image_task(), config(channels_last=channels_last), limits=SHORT, device=CPU, seed=0)
    assert len(Recorder.seen) == 4  # 64 samples in micro-batches of 16
    assert {(x, w) for x, w, _ in Recorder.seen} == {(channels_last, channels_last)}


def test_channels_last_leaves_inputs_that_are_not_images_alone() -> None:
    """A 2-D batch has no channels-last layout: it goes to the device as it is."""
    batch = torch.randn(4, 3)
    assert (
        systems.to_device(batch, CPU, non_blocking=False, channels_last=True).stride()
        == batch.stride()
    )


def test_cudnn_benchmark_is_set_for_the_trial_and_restored_after() -> None:
    before = torch.backends.cudnn.benchmark
    for wanted in (not before, before):
        run(image_task(), config(cudnn_benchmark=wanted), limits=SHORT, device=CPU, seed=0)
        assert {flag for _, _, flag in Recorder.seen} == {wanted}
        assert torch.backends.cudnn.benchmark == before
        Recorder.seen = []


def test_cudnn_benchmark_is_restored_when_the_trial_fails() -> None:
    before = torch.backends.cudnn.benchmark
    task = Task(
        model=Recorder,
        train=TensorDataset(torch.randn(32, 5), torch.zeros(32, dtype=torch.long)),
        val=images(),
    )
    with pytest.raises(RuntimeError):  # a 2-D batch into a 2-D convolution
        run(task, config(cudnn_benchmark=not before), limits=SHORT, device=CPU, seed=0)
    assert torch.backends.cudnn.benchmark == before


def test_compile_trains_a_compiled_module() -> None:
    """torch.compile really runs (its graphs are counted) and the trial still learns."""
    from torch._dynamo.utils import counters

    counters.clear()
    result = run(image_task(), config(compile=True, lr=0.1), limits=SHORT, device=CPU, seed=0)
    assert counters["stats"]["unique_graphs"] >= 1 and result.optimizer_steps == 4
    assert Recorder.seen == []  # the forward ran as compiled code, never in eager mode


def test_a_compile_failure_fails_the_trial_with_a_clear_reason() -> None:
    """No working C++ compiler for inductor on CPU: the trial fails naming torch.compile, not an
    OOM."""
    from torch._inductor import config as inductor

    # A width no other test compiles, and no cache: inductor must generate and compile new code.
    task = Task(model=lambda: Recorder(width=5), train=images(), val=images(seed=1))
    with (
        inductor.patch({"cpp.cxx": ("/bin/false",), "fx_graph_cache": False}),
        pytest.raises(isolation.TrialFailure) as failure,
    ):
        isolation.in_process(task)(config(compile=True), limits=SHORT, device=CPU, seed=0)
    assert failure.value.reason.startswith("CompileFailed: torch.compile failed: "), (
        failure.value.reason
    )
    assert "compiler" in failure.value.reason and not failure.value.oom


def test_compile_problem_names_a_missing_compiler() -> None:
    from torch._inductor import config as inductor

    assert systems.compile_problem(CPU) is None  # g++ is here
    with inductor.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        assert "C++ compiler" in systems.compile_problem(CPU)


def test_channels_last_problem_only_for_models_without_2d_convolutions() -> None:
    assert systems.channels_last_problem(Recorder()) is None
    assert "no 2-D convolutions" in systems.channels_last_problem(
        nn.Sequential(nn.Conv1d(1, 4, 3), nn.Linear(4, 2))
    )


STUDY = """\
task: tests.train.test_systems:image_task
target: {metric: accuracy, value: 0.9}
device: cpu
"""


def write(tmp_path: Path, space: str, baseline: str = "") -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(STUDY + space + baseline)
    return path


def test_prepare_fits_the_switches_to_a_cpu(tmp_path: Path) -> None:
    """The default space on CPU: cuDNN and compile fixed off with one notice each, channels-last
    kept for a model with 2-D convolutions."""
    prepared = preparation.prepare(load(write(tmp_path, "")))
    assert prepared.space["compile"] == prepared.space["cudnn_benchmark"] == Choices((False,))
    assert prepared.space["channels_last"] == Choices((False, True))
    switches = ("compile", "cudnn_benchmark", "channels_last")
    assert sorted(n.split(" fixed")[0] for n in prepared.notices if n.startswith(switches)) == [
        "compile",
        "cudnn_benchmark",
    ]


def test_prepare_fixes_channels_last_for_a_model_without_images(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.9}\ndevice: cpu\n"
    )
    prepared = preparation.prepare(load(path))
    assert prepared.space["channels_last"] == Choices((False,))
    assert any(
        n.startswith("channels_last fixed to false: the task's model has no 2-D convolutions")
        for n in prepared.notices
    )


def test_data_on_device_is_a_choice_only_for_a_task_that_keeps_its_training_set_there(
    tmp_path: Path,
) -> None:
    """digits offers it (Task.device_train); a task whose own Dataset has no copy on the device
    gets it fixed off with one notice, and an error where the study file asks for it alone."""
    assert preparation.prepare(load(write(tmp_path, ""))).space["data_on_device"] == Choices(
        (False, True)
    )
    path = tmp_path / "paced.yaml"
    path.write_text("task: paced\ntarget: {metric: accuracy, value: 0.9}\ndevice: cpu\n")
    prepared = preparation.prepare(load(path))
    assert prepared.space["data_on_device"] == Choices((False,))
    assert [n for n in prepared.notices if n.startswith("data_on_device")] == [
        "data_on_device fixed to false: the task keeps no training set on the device "
        "(Task.device_train, or a TensorDataset)"
    ]
    path.write_text(path.read_text() + "space: {data_on_device: true}\n")
    with pytest.raises(SpecError) as error:
        preparation.prepare(load(path))
    assert "space.data_on_device" in str(error.value)


def test_a_tensor_training_set_too_large_for_the_device_is_not_kept_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blobs' training tensors take 40 KiB (1,024 x 8 floats and 1,024 64-bit labels): on a
    device of 48 KiB they would leave the step under 20% of it, so the knob is fixed off and says
    why; the baseline that asked for it trains from its DataLoader; the study file that asks for
    it alone is an error. On a device of 1 GiB they stay a choice."""
    path = tmp_path / "blobs.yaml"
    path.write_text(
        "task: tests.tasks:blobs\ntarget: {metric: accuracy, value: 0.9}\ndevice: cpu\n"
        "baseline: {data_on_device: true}\n"
    )
    memory = {"bytes": 48 * 2**10}  # what NVML reports for the device; None on a CPU
    monkeypatch.setattr(preparation.telemetry, "memory_bytes", lambda device: memory["bytes"])
    prepared = preparation.prepare(load(path))
    assert prepared.space["data_on_device"] == Choices((False,))
    assert prepared.baseline["data_on_device"] is False
    assert (
        "data_on_device fixed to false: the training set's tensors (0.04 MiB) would take more "
        "than 80% of the device's 0.05 MiB" in prepared.notices
    )
    memory["bytes"] = 2**30
    assert preparation.prepare(load(path)).space["data_on_device"] == Choices((False, True))
    memory["bytes"] = 48 * 2**10
    path.write_text(path.read_text() + "space: {data_on_device: true}\n")
    with pytest.raises(SpecError) as error:
        preparation.prepare(load(path))
    assert "space.data_on_device" in str(error.value) and "80% of the device's" in str(error.value)


def test_a_switch_fixed_on_that_cannot_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as error:
        preparation.prepare(load(write(tmp_path, "space: {cudnn_benchmark: true}\n")))
    assert "space.cudnn_benchmark" in str(error.value) and "cuDNN runs only on CUDA" in str(
        error.value
    )


def test_a_baseline_switch_that_cannot_run_is_turned_off_with_a_notice(tmp_path: Path) -> None:
    prepared = preparation.prepare(load(write(tmp_path, "", "baseline: {cudnn_benchmark: true}\n")))
    assert prepared.baseline["cudnn_benchmark"] is False
    assert "baseline cudnn_benchmark set to false: cuDNN runs only on CUDA" in prepared.notices
