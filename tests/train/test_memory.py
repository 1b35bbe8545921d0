from __future__ import annotations

import gc
import weakref

import pytest
import torch

from autotune.train.oom import free_memory, is_oom, oom_reason


def real_allocator_oom() -> RuntimeError:
    """The CPU allocator's own failure, caused for real."""
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:
        return exc
    raise AssertionError("allocating 4 EiB succeeded")


@pytest.mark.parametrize(
    "exc",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
        RuntimeError(
            "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 79.10 GiB total capacity)"
        ),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
        RuntimeError(
            "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. "
            "This error may appear if you passed in a non-contiguous input."
        ),
        RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB)"),
        MemoryError(),
        real_allocator_oom(),
    ],
    ids=[
        "cuda-oom-error",
        "cuda-runtime",
        "cublas",
        "cudnn-alloc",
        "cudnn-not-supported",
        "mps",
        "memoryerror",
        "cpu-allocator",
    ],
)
def test_allocation_failures_are_oom(exc: BaseException) -> None:
    assert is_oom(exc)
    assert oom_reason(exc).startswith("out of memory: ")


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)"),
        RuntimeError(),
        ValueError("CUDA out of memory"),  # only RuntimeError carries the allocator's messages
        KeyboardInterrupt(),
    ],
)
def test_other_errors_are_not_oom(exc: BaseException) -> None:
    assert not is_oom(exc)


def test_oom_reason_is_one_line() -> None:
    reason = oom_reason(RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore detail"))
    assert "\n" not in reason and "Tried to allocate 2 GiB" in reason


def test_free_memory_collects_what_a_failed_trial_left_in_a_cycle() -> None:
    class Holder:
        pass

    holder = Holder()
    holder.self, holder.tensor = holder, torch.ones(1000)
    alive = weakref.ref(holder)
    gc.disable()  # so that only free_memory can collect the cycle
    try:
        del holder
        assert alive() is not None
        free_memory()
        assert alive() is None
    finally:
        gc.enable()
