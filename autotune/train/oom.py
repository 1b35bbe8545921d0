"""Out of memory: deciding whether an exception is one, and giving the memory back.

Detection is a pure function of the exception so that it can be tested on CPU (after
accelerate's `utils/memory.py`); the response lives with the study loop.
"""

from __future__ import annotations

import gc
import re
from collections.abc import Iterable

import torch

# Messages the back-ends raise as a plain RuntimeError when an allocation fails.
OOM_MESSAGES = (
    "CUDA out of memory",  # CUDA caching allocator (older torch, or when re-raised as RuntimeError)
    "CUBLAS_STATUS_ALLOC_FAILED",  # cuBLAS could not get its workspace
    "CUDNN_STATUS_ALLOC_FAILED",  # cuDNN could not get its workspace
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. "
    "This error may appear if you passed in a non-contiguous input",
    "DefaultCPUAllocator: can't allocate memory",  # CPU allocator (Linux)
    "DefaultCPUAllocator: not enough memory",  # CPU allocator (Windows)
    "MPS backend out of memory",
    "HIP out of memory",
    "XPU out of memory",
)


def is_oom(exc: BaseException) -> bool:
    """True if `exc` says an allocation failed on any device."""
    if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, RuntimeError) and exc.args:
        message = str(exc.args[0])
        return any(fragment in message for fragment in OOM_MESSAGES)
    return False


# How a traceback's last line names an out-of-memory exception: torch.OutOfMemoryError (also
# torch.cuda.OutOfMemoryError), Python's MemoryError, with or without a message.
OOM_EXCEPTION = re.compile(r"(?:[\w.]+\.)?(?:OutOfMemoryError|MemoryError)(?::|$)")


def oom_line(lines: Iterable[str]) -> str | None:
    """The last of `lines` (a process's last lines of stderr) that says an allocation failed, or
    None.

    The text-only twin of `is_oom`, for a training command whose exception autotune only reads.
    """
    for line in reversed(list(lines)):
        line = line.strip()
        if OOM_EXCEPTION.match(line) or any(fragment in line for fragment in OOM_MESSAGES):
            return line
    return None


def oom_reason(exc: BaseException) -> str:
    """A one-line reason to store on the pruned trial."""
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"out of memory: {exc.__class__.__name__}: {first_line}"[:500]


def free_memory() -> None:
    """Collect what the failed trial left and return cached CUDA blocks to the driver.

    The caller must have dropped its references first (including the exception's traceback,
    which holds the trial's frames and so its tensors).
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
