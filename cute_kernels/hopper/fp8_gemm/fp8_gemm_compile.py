"""Compile the FP8 GEMM for one Fp8GemmSpec against fake tensors (no GPU, no data).

M, N and K are symbolic (N and K divisible by 16: TMA needs 16-byte rows of e4m3), so one compiled
kernel per spec serves every shape; the scale tensors' widths are symbolic too.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel, compile_sm90

from .fp8_gemm import Fp8GemmSm90
from .fp8_gemm_spec import Fp8GemmSpec, Fp8QuantRowsSpec
from .fp8_quant_rows import Fp8QuantRowsSm90


def fake_fp8_gemm_arguments(spec: Fp8GemmSpec) -> tuple:
    """Fake tensors in the argument order of Fp8GemmSm90.__call__."""
    m, scale_rows_b, scale_cols = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    n, k = cute.sym_int32(divisibility=16), cute.sym_int32(divisibility=16)

    def rows(dtype, n_rows, n_cols, align):
        return make_fake_compact_tensor(dtype, (n_rows, n_cols), stride_order=(1, 0), assumed_align=align)

    a, b = rows(cutlass.Float8E4M3FN, m, k, 16), rows(cutlass.Float8E4M3FN, n, k, 16)
    if spec.split_k:  # the fp32 workspace [splits, M, N]
        c = make_fake_compact_tensor(cutlass.Float32, (cute.sym_int32(), m, n), stride_order=(2, 1, 0),
                                     assumed_align=16)
    else:
        c = rows(cutlass.BFloat16, m, n, 16)
    scale_a = rows(cutlass.Float32, m, scale_cols, 4)
    scale_b = rows(cutlass.Float32, scale_rows_b, scale_cols, 4)
    return a, b, c, scale_a, scale_b, make_fake_stream()


def fake_quant_rows_arguments(spec: Fp8QuantRowsSpec) -> tuple:
    """x [M, K] bf16, q [M, K] e4m3, scale [M, 1] fp32: the argument order of Fp8QuantRowsSm90.__call__."""
    m, k = cute.sym_int32(), cute.sym_int32(divisibility=16)
    x = make_fake_compact_tensor(cutlass.BFloat16, (m, k), stride_order=(1, 0), assumed_align=16)
    q = make_fake_compact_tensor(cutlass.Float8E4M3FN, (m, k), stride_order=(1, 0), assumed_align=16)
    scale = make_fake_compact_tensor(cutlass.Float32, (m, 1), stride_order=(1, 0), assumed_align=4)
    return x, q, scale, make_fake_stream()


def fake_arguments(spec: Fp8GemmSpec | Fp8QuantRowsSpec) -> tuple:
    if isinstance(spec, Fp8QuantRowsSpec):
        return fake_quant_rows_arguments(spec)
    return fake_fp8_gemm_arguments(spec)


def compile_fp8_gemm(spec: Fp8GemmSpec | Fp8QuantRowsSpec, keep_artifacts: bool = False) -> CompiledKernel:
    """Compile for sm_90a (the GEMM or the activation quantizer, by spec); with keep_artifacts the
    PTX text and cubin bytes are returned too."""
    kernel = Fp8QuantRowsSm90() if isinstance(spec, Fp8QuantRowsSpec) else Fp8GemmSm90(spec)
    return compile_sm90(kernel, fake_arguments(spec), spec.name, keep_artifacts)


FP8_GEMM_CACHE = CompileCache(compile_fp8_gemm)
