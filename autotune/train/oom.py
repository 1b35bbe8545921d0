"""Out of memory: deciding whether an exception is one, and giving the memory back.

Detection is a pure function of the exception so that it can be tested on CPU (after
accelerate's `utils/memory.py`); the response lives with the study loop.
"""

from __future__ import annotations

import collections
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


def says_oom(line: str) -> bool:
    """Whether one line of text (an exception's last line) says an allocation failed."""
    line = line.strip()
    return bool(OOM_EXCEPTION.match(line)) or any(fragment in line for fragment in OOM_MESSAGES)


TRACEBACK = "Traceback (most recent call last):"
# torchrun and DDP prefix a rank's lines with its number
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")
# C++'s std::terminate, for an exception nothing caught (c10::OutOfMemoryError)
TERMINATE = re.compile(r"terminate called after throwing an instance of '([\w:.]+)'")
# A launcher's own error about a process it started: the failure is that process's, above it.
LAUNCHER_ERRORS = re.compile(r"(?:[\w.]+\.)?(?:ChildFailedError|CalledProcessError)\b")


class FinalErrors:
    """The errors a process's stderr ends with, read as it is written: the last line of each
    Python traceback (the exception) and each C++ exception that nothing caught, and the last
    line of all, for a program that raises neither."""

    KEPT = 16

    def __init__(self) -> None:
        self.errors: collections.deque[str] = collections.deque(maxlen=self.KEPT)
        self.last_line = ""
        self._in_traceback = False

    def feed(self, lines: Iterable[str]) -> None:
        for raw in lines:
            line = RANK_PREFIX.sub("", raw.rstrip())
            if not line.strip():
                continue
            self.last_line = line.strip()
            if line.startswith(TRACEBACK):
                self._in_traceback = True
            elif (terminate := TERMINATE.search(line)) is not None:
                self.errors.append(terminate.group(1).replace("::", "."))
            elif self._in_traceback and not line[0].isspace():
                self.errors.append(line.strip())  # the exception, after its frames
                self._in_traceback = False

    def out_of_memory(self) -> str | None:
        """The line that says the process failed because an allocation did, or None: decided by
        its final error only (past a launcher's own about it), never by a line of its log that
        merely mentions memory."""
        errors = list(self.errors)
        if errors and LAUNCHER_ERRORS.match(errors[-1]):
            # The launcher's ranks ended before its own error: one of them that ran out of memory
            # is the cause, whatever its peers' collectives raised as it went.
            ranks = [error for error in errors if not LAUNCHER_ERRORS.match(error)]
            return next((error for error in reversed(ranks) if says_oom(error)), None)
        if errors:
            return errors[-1] if says_oom(errors[-1]) else None
        return self.last_line if says_oom(self.last_line) else None


def oom_line(lines: Iterable[str]) -> str | None:
    """The line of `lines` (a process's stderr) that says it failed for want of memory, or None.

    The text-only twin of `is_oom`, for a training command whose exception autotune only reads.
    """
    errors = FinalErrors()
    errors.feed(lines)
    return errors.out_of_memory()


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
