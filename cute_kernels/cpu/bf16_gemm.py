"""Linears with bf16 weights on the CPU: csrc/cpu_bf16_gemm.c (built by build.py), fp32 activations in
and out, the activations rounded to bf16 once per call and every product accumulated in fp32
(vdpbf16ps on AVX-512 BF16; bf16 widened to fp32 and FMA'd on AVX2 and in portable C).

bf16_linear_ref is the oracle: it rounds x the same way and multiplies in float64, so the C result
differs from it only by fp32 summation order. Where the library cannot be built, bf16_linear runs it.
"""
from __future__ import annotations

import ctypes

import torch

from cute_kernels.cpu import build, quant_amx

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# Below this many multiply-adds a product stays on the calling thread (as quant_gemm.PARALLEL_MIN_MACS).
PARALLEL_MIN_MACS = 1 << 20
# From this many rows the AVX-512 BF16 build packs weight panels (cpu_bf16_gemm.c): measured one core,
# 3072x576 and 576x1536 weights, 15 rows 0.74 / 0.34 ms on the dot-product tiles against 0.80 / 0.40
# packed at 16, packed 1.5x ahead at 32 and at oneDNN's bf16 rate (~190 GFLOP/s) by 512.
PACK_MIN_ROWS = 16
NEVER = 1 << 62
# From this many rows a non-invariant linear takes the AMX tiles (csrc/amx/cpu_bf16_amx.c) where the CPU has them.
# Measured on the 2-core AMX machine, 2 threads, 960x576, 3072x576, 576x1536 weights: 0.6-0.7x the dot-product
# tiles at 4 rows, 1.1-1.4x at 8, 1.7-2.0x at 12; 3.1-5.2x the packed panels at 16 and 3.8-6.8x at 32.
AMX_MIN_ROWS = 8


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_bf16_gemm", {
        "bf16_linear": ([_P, _P, _P, _P, _I, _I, _I, _I, _C], ctypes.c_int),
        "bf16_round_rows": ([_P, _P, _I], None),
        "bf16_path": ([], ctypes.c_char_p)})


def _amx_library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_bf16_amx", {"bf16_linear_amx": ([_P, _P, _P, _P, _I, _I, _I, _C], _C)})


def unavailable_reason() -> str | None:
    """None when the C library is built and loaded; otherwise why not."""
    return _library()[1]


def path() -> str:
    """The instruction the built library multiplies with: vdpbf16ps, avx2-fma, portable-c (or torch reference)."""
    lib = _library()[0]
    return "torch reference" if lib is None else lib.bf16_path().decode()


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16) in the default build."""
    return "avx512_bf16" in build.cpu_flags() and unavailable_reason() is None


def bf16_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """bf16(x) @ weight^T (+ bias) in float64, returned as float32; weight [n, k] bfloat16."""
    y = x.bfloat16().double() @ weight.double().T
    return (y if bias is None else y + bias.double()).float()


def round_bf16_c(x: torch.Tensor) -> torch.Tensor:
    """x (float32, contiguous) rounded to bf16 by the C library's conversion."""
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    _library()[0].bf16_round_rows(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                threads: int | None = None, invariant: bool = False) -> torch.Tensor:
    """x [rows, k] float32 @ weight^T (+ bias): weight [n, k] contiguous bfloat16, bias [n] float32.
    invariant: one summation order at every row count (a row gets the same bits in any batch)."""
    lib = _library()[0]
    if (lib is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2
            or weight.dtype != torch.bfloat16 or not weight.is_contiguous() or weight.shape[1] != x.shape[1]):
        return bf16_linear_ref(x, weight, bias)
    x = x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    if threads is None:
        threads = torch.get_num_threads() if m * n * k >= PARALLEL_MIN_MACS else 1
    bias = None if bias is None else bias.float().contiguous()  # held: the kernel reads it
    y = torch.empty(m, n)
    # quant_amx.available: whether this route's AMX build may use the tiles in this process (the same for both)
    if not invariant and m >= AMX_MIN_ROWS and k % 2 == 0 and quant_amx.available():
        rc = _amx_library()[0].bf16_linear_amx(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
                                               y.data_ptr(), m, n, k, threads)
        if rc == 2:
            raise MemoryError("bf16_linear_amx: out of memory for its buffers")
        if rc == 0:
            return y
    if lib.bf16_linear(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), y.data_ptr(),
                       m, n, k, NEVER if invariant else PACK_MIN_ROWS, threads):
        raise MemoryError("bf16_linear: out of memory for the bf16 copy of the activations")
    return y
