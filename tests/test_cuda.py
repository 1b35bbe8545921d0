"""The CUDA paths, for real: run on a machine with a GPU
(`bash scripts/test.sh tests/test_cuda.py`); skipped on CPU-only machines, where
tests/train/test_memory.py and tests/train/test_trial.py cause the same exceptions and states
instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.runners import isolation
from autotune.search.space import DEFAULT_BASELINE, complete
from autotune.train.config import Limits, TrialConfig
from tests.tasks import OOM_BATCH, allocator_oom, blobs

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU (scripts/gpu-check.sh runs these on one)",
)

REPO = Path(__file__).resolve().parent.parent
LIMITS = Limits(target=0.9, max_epochs=4, max_seconds=30, eval_every=0.5)
CUDA = torch.device("cuda")


def config(**knobs: object) -> TrialConfig:
    return TrialConfig.from_mapping(complete({**DEFAULT_BASELINE, "lr": 0.1, **knobs}))


def gpu_memory_used() -> int:
    """Bytes in use on GPU 0 by every process, as the driver (NVML) counts them."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("pin_memory", [False, True])
def test_each_precision_trains_to_the_target_on_cuda(precision: str, pin_memory: bool) -> None:
    run_trial = isolation.in_process(blobs())
    result = run_trial(
        config(precision=precision, pin_memory=pin_memory, num_workers=1, prefetch_factor=2),
        limits=LIMITS,
        device=CUDA,
        seed=0,
    )
    assert result.reached, (precision, result.best_metric)
    assert result.peak_memory_bytes > 0 and result.device_name == torch.cuda.get_device_name(CUDA)


def test_a_real_cuda_oom_is_an_oom_and_its_memory_is_freed() -> None:
    before = torch.cuda.memory_allocated()
    with pytest.raises(isolation.TrialFailure) as failure:
        isolation.in_process(allocator_oom())(
            config(batch_size=OOM_BATCH), limits=LIMITS, device=CUDA, seed=0
        )
    assert failure.value.oom and "CUDA out of memory" in failure.value.reason, failure.value.reason
    assert torch.cuda.memory_allocated() == before  # the trial's tensors went with it
    result = isolation.in_process(blobs())(
        config(batch_size=32), limits=LIMITS, device=CUDA, seed=0
    )
    assert result.reached  # and the next trial runs on the same GPU


def test_a_trial_in_a_child_gives_all_its_gpu_memory_back() -> None:
    before = gpu_memory_used()
    run_trial = isolation.in_child(
        "tests.tasks:allocator_oom", study_path=REPO / "study.yaml", hang_after=120
    )
    result = run_trial(config(batch_size=32), limits=LIMITS, device=CUDA, seed=0)
    assert result.reached and result.peak_memory_bytes > 0
    with pytest.raises(isolation.TrialFailure) as failure:
        run_trial(config(batch_size=OOM_BATCH), limits=LIMITS, device=CUDA, seed=0)
    assert failure.value.oom
    # The child's CUDA context (hundreds of MiB) and caching allocator are gone with it.
    assert gpu_memory_used() - before < 64 * 2**20, (before, gpu_memory_used())


def test_a_warm_child_keeps_its_context_between_trials_and_goes_with_its_memory_after_an_oom() -> (
    None
):
    from autotune.runners import warm

    before = gpu_memory_used()
    child = warm.WarmChild(
        "tests.tasks:allocator_oom",
        study_path=REPO / "study.yaml",
        hang_after=120,
        measure_hang_after=120,
    )
    for _ in range(2):
        assert child.run_trial(config(batch_size=32), limits=LIMITS, device=CUDA, seed=0).reached
    # nothing left on the device: the same process serves the next trial
    assert child.replaced == []
    first = child.pid
    with pytest.raises(isolation.TrialFailure) as failure:
        child.run_trial(config(batch_size=OOM_BATCH), limits=LIMITS, device=CUDA, seed=0)
    assert failure.value.oom and child.pid is None and child.replaced
    assert gpu_memory_used() - before < 64 * 2**20, (before, gpu_memory_used())
    assert child.run_trial(config(batch_size=32), limits=LIMITS, device=CUDA, seed=0).reached
    assert child.pid != first
    child.close()


def test_nvml_sees_the_gpu_torch_uses() -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    assert (name.decode() if isinstance(name, bytes) else name) == torch.cuda.get_device_name(0)


def test_the_gather_s_measured_peak_holds_the_training_set_s_copy() -> None:
    """The loader rate of the training set kept on the device peaks at its copy and more (the
    probe's memory fit adds it); a DataLoader's holds a batch or so, far less."""
    from autotune.probe import rates

    task = blobs()
    copy = sum(t.numel() * t.element_size() for t in task.train.tensors)
    loaders = {
        "gather": config(batch_size=64, data_on_device=True),
        "loader": config(batch_size=64, num_workers=0),
    }
    measured = rates.measure_loaders_in_turn(task, loaders, device=CUDA, seed=0)
    assert measured["gather"].peak_memory_bytes >= copy, (measured["gather"], copy)
    assert measured["loader"].peak_memory_bytes < copy / 4, (measured["loader"], copy)
