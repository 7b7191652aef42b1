"""Torch entry points of the FP8 GEMM and the activation quantizer on CUDA tensors (fp8_gemm,
quantize_rows), and their launch: compiled by the DSL's JIT on first use (FP8_GEMM_CACHE) or
taken from the ahead-of-time library (see toolchain/kernel_path.py)."""
from __future__ import annotations

import torch

from cute_kernels.fp8_quant import E4M3
from cute_kernels.toolchain.kernel_path import kernel_path

from .fp8_gemm_host import Fp8GemmLaunch, check_quant_rows_input, prepare_fp8_gemm
from .fp8_gemm_spec import Fp8QuantRowsSpec

# Divisibility of each tensor's (rows, cols) as compiled (N and K are multiples of 16); None: a
# static mode (the quantizer's scale is [M, 1] with the 1 compiled in).
_DIVISIBILITY = ((1, 16), (16, 16), (1, 16), (1, 1), (1, 1))
_SPLIT_DIVISIBILITY = ((1, 16), (16, 16), (1, 1, 16), (1, 1), (1, 1))  # C: the workspace [splits, M, N]
_QUANT_DIVISIBILITY = ((1, 16), (1, 16), (1, None))


def _as_cute(t: torch.Tensor, divisibility: tuple[int | None, ...]):
    """DLPack view with every size dynamic, as compiled; DLPack has no fp8, so e4m3 travels as
    uint8 and gets its element type back here."""
    import cutlass
    from cutlass.cute.runtime import from_dlpack

    is_fp8 = t.dtype == torch.float8_e4m3fn
    x = from_dlpack((t.view(torch.uint8) if is_fp8 else t).detach(), assumed_align=16 if t.element_size() < 4 else 4)
    if is_fp8:
        x.element_type = cutlass.Float8E4M3FN
    for mode, divisible_by in enumerate(divisibility):
        if divisible_by is not None:
            x = x.mark_compact_shape_dynamic(mode=mode, stride_order=tuple(range(t.dim())),
                                             divisibility=divisible_by)
    return x


def _run(spec, tensors: tuple[torch.Tensor, ...], divisibility: tuple[tuple[int | None, ...], ...]) -> None:
    if kernel_path() == "aot":
        from .fp8_gemm_aot import launch_aot

        return launch_aot(spec, tensors)
    import cuda.bindings.driver as cuda

    from .fp8_gemm_compile import FP8_GEMM_CACHE

    compiled = FP8_GEMM_CACHE.get(spec)
    stream = cuda.CUstream(torch.cuda.current_stream(tensors[0].device).cuda_stream)
    compiled.fn(*(_as_cute(t, d) for t, d in zip(tensors, divisibility)), stream)


def launch_fp8_gemm(launch: Fp8GemmLaunch) -> None:
    """The GEMM; with split-K, then the reduction of its fp32 partials into bf16 (a sum over the
    splits in fixed order, so results do not depend on which split finishes first)."""
    _run(launch.spec, launch.kernel_tensors(), _SPLIT_DIVISIBILITY if launch.spec.split_k else _DIVISIBILITY)
    if launch.workspace is not None:
        torch.sum(launch.workspace, dim=0, out=launch.out)


def launch_quant_rows(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    _run(Fp8QuantRowsSpec(), (x, q, scale), _QUANT_DIVISIBILITY)


def fp8_kernels_unavailable_reason() -> str | None:
    """None when this process can launch the FP8 kernels (GPU permitting), else why not."""
    from cute_kernels.toolchain.kernel_path import dsl_installed

    if kernel_path() == "jit":
        return None if dsl_installed() else "nvidia-cutlass-dsl is not installed"
    from cute_kernels.toolchain.aot_library import AotUnavailable, get_library

    from .fp8_gemm_aot import AotFp8Kernels
    from .fp8_gemm_spec import runtime_variants

    try:
        variants = get_library(AotFp8Kernels).variants
    except AotUnavailable as exc:
        return f"no usable AOT kernels: {exc}"
    missing = {s.name for s in runtime_variants()} | {Fp8QuantRowsSpec().name}
    missing -= variants
    return f"AOT library lacks {sorted(missing)}" if missing else None


def fp8_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             out: torch.Tensor | None = None, splits: int | None = None) -> torch.Tensor:
    """bf16 [M, N] = (a x b^T) scaled, on an sm_90 GPU (reference.fp8_gemm_ref's contract); splits:
    see prepare_fp8_gemm."""
    launch = prepare_fp8_gemm(a, b, scale_a, scale_b, out, splits)
    if not a.is_cuda:
        raise ValueError("fp8 gemm (cute): tensors must be on a CUDA device")
    if a.shape[0] > 0:
        launch_fp8_gemm(launch)
    return launch.out


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8_quant.quantize_rowwise of bf16 CUDA rows [M, K] (K a multiple of 16), in one kernel."""
    check_quant_rows_input(x)
    q = torch.empty(x.shape, dtype=E4M3, device=x.device)
    scale = torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)
    if x.shape[0] > 0:
        launch_quant_rows(x, q, scale)
    return q, scale
