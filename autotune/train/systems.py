"""The GPU systems knobs in torch terms: channels-last memory format, torch.compile, cuDNN's
algorithm search, TF32 matrix products, the fused optimizer step, activation checkpointing
(checkpointing.py). Whether each can run here, and what a trial does with it.

None of them changes the maths (float noise aside); each changes speed, and channels_last,
compile and checkpointing change memory too.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from autotune.train import checkpointing as activation_checkpointing
from autotune.train import oom
from autotune.train.tasks import takes

# The exceptions torch.compile raises live in these modules; the first forward pass is where a
# compiled model compiles, so they surface there, inside the trial.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor")


def compile_problem(device: torch.device) -> str | None:
    """Why torch.compile (its default inductor backend) cannot run on `device` here, or None."""
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return (
                "torch.compile does not support Python "
                f"{sys.version_info.major}.{sys.version_info.minor} with torch {torch.__version__}"
            )
        if device.type == "cuda":
            from torch.utils._triton import has_triton

            return (
                None
                if has_triton()
                else "torch.compile needs Triton and a GPU of compute capability 7.0 or more"
            )
        from torch._inductor import config, cpp_builder, exc

        compilers = (
            config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
        )
        try:
            cpp_builder.cpp_compiler_search(tuple(compilers))
        except exc.InvalidCxxCompiler:
            return (
                "torch.compile needs a C++ compiler on CPU (g++, or the one $CXX names), "
                "and none works here"
            )
    except ImportError as error:  # a torch build without the compiler stack
        return f"torch.compile is not available in this torch build ({error})"
    return None


def tf32_problem(device: torch.device) -> str | None:
    """Why TF32 matrix products cannot run on `device`, or None (not CUDA: devices.py says so)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return (
            "TF32 tensor cores are on NVIDIA GPUs of compute capability 8.0 (Ampere) or more only"
        )
    return None


def fused_optimizer_problem(
    optimizer: Callable[..., torch.optim.Optimizer], params: Mapping[str, Any], device: torch.device
) -> str | None:
    """Why the task's optimizer factory has no fused step on `device`, or None: it must take a
    `fused` argument, and build with fused=True for a parameter on the device (torch's own check
    of dtype and device support runs when the optimizer is built). `params`: the study's own
    parameters, passed as a trial passes them."""
    if "fused" not in takes(optimizer, {"fused": True}, after=2):
        return "the task's optimizer factory takes no `fused` argument"
    parameter = torch.zeros(1, device=device, requires_grad=True)
    try:
        optimizer([parameter], 0.01, **takes(optimizer, params, after=2), fused=True)
    except Exception as error:  # noqa: BLE001 - whatever the factory raises is the reason
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return (
            f"the task's optimizer has no fused step on {device.type} "
            f"({type(error).__name__}: {detail})"
        )[:300]
    return None


def has_batch_norm(model: nn.Module) -> bool:
    """True when the model normalizes by batch statistics: its micro-batch then changes the
    maths."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def has_2d_convolutions(model: nn.Module) -> bool:
    """True when the model holds a 4-D weight (a 2-D convolution): channels-last has something to
    lay out. Other models (linear, 1-D) run the same either way."""
    return any(parameter.dim() == 4 for parameter in model.parameters())


def channels_last_problem(model: nn.Module) -> str | None:
    return (
        None
        if has_2d_convolutions(model)
        else "the task's model has no 2-D convolutions to lay out channels-last"
    )


def prepare_model(
    model: nn.Module,
    *,
    channels_last: bool,
    compile: bool,
    checkpointing: bool | float = False,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
) -> tuple[nn.Module, nn.Module]:
    """(the module to train, the module to evaluate): the same parameters either way. `wrap`
    (DistributedDataParallel over several ranks) goes around the model before it is compiled, as
    torch's DDP and compile documents have it.

    Evaluation uses the uncompiled, unwrapped module: its batch size and eval-mode BatchNorm would
    make torch.compile compile a second graph, and evaluation runs off the clock anyway.
    Checkpointed blocks run plainly there (checkpointing.py): nothing is kept for a backward pass.
    """
    activation_checkpointing.apply(model, checkpointing)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    trained = wrap(model) if wrap is not None else model
    return (torch.compile(trained) if compile else trained), model


def to_device(
    inputs: torch.Tensor, device: torch.device, *, non_blocking: bool, channels_last: bool
) -> torch.Tensor:
    """A batch's inputs on the device, channels-last where asked and the batch is 4-D
    (N, C, H, W)."""
    if channels_last and inputs.dim() == 4:
        return inputs.to(device, non_blocking=non_blocking, memory_format=torch.channels_last)
    return inputs.to(device, non_blocking=non_blocking)


@contextlib.contextmanager
def process_settings(*, cudnn_benchmark: bool, tf32: bool) -> Iterator[None]:
    """The knobs that are torch's process-wide settings, on for the trial and as they were after:
    cuDNN's algorithm search (whatever else cuDNN is set to) and float32 matrix products on TF32
    ('high') or in full float32 ('highest', torch's default)."""
    cudnn = torch.backends.cudnn
    benchmark, matmul, wanted = (
        cudnn.benchmark,
        torch.get_float32_matmul_precision(),
        "high" if tf32 else "highest",
    )
    cudnn.benchmark = cudnn_benchmark
    # Set only where it differs: setting it pins torch's finer per-backend settings too.
    if matmul != wanted:
        torch.set_float32_matmul_precision(wanted)
    try:
        yield
    finally:
        cudnn.benchmark = benchmark
        if matmul != wanted:
            torch.set_float32_matmul_precision(matmul)


def compile_failure(exc: BaseException) -> str | None:
    """The reason to record when `exc` came from torch.compile's compiler, else None."""
    if not type(exc).__module__.startswith(COMPILER_MODULES) or oom.is_oom(exc):
        # an OOM while compiling (autotuning kernels, say) is an OOM: the trial is pruned
        return None
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # BackendCompilerFailed starts with "backend='inductor' raised:" and names the error next.
    detail = (
        " ".join(lines[:2])
        if lines and lines[0].endswith("raised:")
        else (lines[0] if lines else "")
    )
    return f"torch.compile failed: {type(exc).__name__}: {detail}"[:500]


class CompileFailed(RuntimeError):
    """torch.compile could not compile the model: the trial fails with this reason."""
