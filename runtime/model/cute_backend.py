"""The `cute` attention backend: CuTe DSL kernels on Hopper (sm_90), same contract as the torch reference.

prefill_attention(...) takes exactly attention_ref.prefill_attention_ref's arguments. It runs the
sm_90a kernel, JIT-compiled when nvidia-cutlass-dsl is installed, else the ahead-of-time library
built by `python -m cute_kernels.aot` (build/aot or $CUTE_AOT_DIR; $CUTE_KERNELS_PATH forces one).
It raises CuteBackendUnavailable, saying why, anywhere else (CPU tensors, a non-Hopper GPU, neither
the DSL nor usable AOT kernels); callers pick the torch backend in that case.
"""
from __future__ import annotations

import torch

from cute_kernels.attention_args import PrefillArgs


class CuteBackendUnavailable(RuntimeError):
    pass


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """None when the cute kernels can run on `device`, else a one-line reason."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    device = torch.device("cuda") if device is None else device
    if device.type != "cuda":
        return f"tensors are on {device}, not CUDA"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"needs an sm_90 (Hopper) GPU, found sm_{major}{minor}"
    from cute_kernels.toolchain.kernel_path import kernels_unavailable_reason

    return kernels_unavailable_reason()


def kernel_path() -> str:
    """'jit' (DSL installed) or 'aot' (precompiled library): for logs and the GPU suite."""
    from cute_kernels.toolchain.kernel_path import kernel_path as path

    return path()


_ready_devices: set[torch.device] = set()  # checked once each: the check is not free, the call is per layer


def prefill_attention(args: PrefillArgs) -> torch.Tensor:
    """reference.prefill_attention_ref's contract, run by the sm_90a kernel."""
    if args.q.device not in _ready_devices:
        reason = unavailable_reason(args.q.device)
        if reason is not None:
            raise CuteBackendUnavailable(f"cute prefill attention unavailable: {reason}")
        _ready_devices.add(args.q.device)
    from cute_kernels.hopper.prefill_launch import prefill_attention as kernel

    return kernel(args)
