"""Torch entry points of the fused elementwise kernels on CUDA tensors, with the contracts of their
references (cute_kernels.reference): add_rms_norm, rope_ (in place), silu_and_mul, write_kv.

Kernels come from the DSL's JIT (each FusedOpSpec compiles once per process: FUSED_CACHE) or from the
ahead-of-time library (fused_aot.py); see toolchain/kernel_path.py. Launches run on torch's current
stream and never synchronize, so they can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from cute_kernels.toolchain.kernel_path import kernel_path

from .fused_host import FusedLaunch, prepare_add_rms_norm, prepare_rope, prepare_silu_and_mul, prepare_write_kv


def launch_fused(launch: FusedLaunch) -> None:
    if not launch.slots.is_cuda:
        raise ValueError(f"{launch.spec.op} (cute): tensors must be on a CUDA device")
    if launch.rows == 0:
        return
    if kernel_path() == "aot":
        from .fused_aot import launch_fused_aot

        return launch_fused_aot(launch)
    _launch_fused_jit(launch)


def _launch_fused_jit(launch: FusedLaunch) -> None:
    import cuda.bindings.driver as cuda
    import cutlass
    from cutlass.cute.runtime import from_dlpack

    from .fused_compile import FUSED_CACHE

    compiled = FUSED_CACHE.get(launch.spec)
    matrices = [_as_matrix(t, from_dlpack, cutlass) for t in launch.matrices]
    slots = from_dlpack(launch.slots, assumed_align=8).mark_layout_dynamic()
    stream = cuda.CUstream(torch.cuda.current_stream(launch.slots.device).cuda_stream)
    compiled.fn(*matrices, slots, cutlass.Float32(launch.scalar), stream)


def _as_matrix(t: torch.Tensor, from_dlpack, cutlass):
    """DLPack has no fp8: an e4m3 matrix travels as uint8 and gets its element type back here."""
    is_fp8 = t.dtype == torch.float8_e4m3fn
    x = from_dlpack((t.view(torch.uint8) if is_fp8 else t).detach(), assumed_align=16)  # as fused_host checked
    if is_fp8:
        x.element_type = cutlass.Float8E4M3FN
    return x.mark_layout_dynamic(leading_dim=1)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    launch, h, new_residual = prepare_add_rms_norm(x, residual, weight, eps)
    launch_fused(launch)
    return h, new_residual


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    launch_fused(prepare_rope(x, cos, sin))
    return x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    launch, out = prepare_silu_and_mul(gate_up)
    launch_fused(launch)
    return out


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """Into float8_e4m3fn caches with k_scale/v_scale fp32 [kv_heads]: quantized (cute_kernels.kv_e4m3)."""
    launch_fused(prepare_write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale))
