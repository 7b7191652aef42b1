"""Quantized linears on AMX tiles (csrc/amx/cpu_quant_amx.c, built by build.py): grouped Q4_0, Q4_1 and Q8_0
weights (row_groups.py) dequantized a 32-column panel at a time to bf16 and multiplied by TDPBF16PS
against bf16 activations, fp32 sums. quant_gemm.choose_path sends prefill row counts here on CPUs with
AMX; the oracle in the tests is the fp32 product with the dequantized weight (quant_blocks.dequantize).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from cute_kernels.cpu import build, row_groups
from cute_kernels.cpu.quant_blocks import TYPE_IDS

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_quant_amx", {
        "quant_linear_amx": ([_P, _P, _P, _C, _P, _P, _I, _I, _I, _C], _C),
        "quant_glu_amx": ([_P, _P, _C, _P, _I, _I, _I, _C, _C], _C),
        "amx_available": ([], _C)})


@functools.cache  # per route: asks the kernel for the tile state once
def _available(route: str | None) -> bool:
    lib = _library()[0]
    return lib is not None and lib.amx_available() == 1


def available() -> bool:
    """This build has the AMX route and the kernel lets this process use the tile registers."""
    return "amx_bf16" in build.cpu_flags() and _available(build.active_route())


def reads(type_name: str) -> bool:
    return type_name in row_groups.BASE


def amx_linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None,
               threads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, k] float32 contiguous @ W^T (+ bias, float32 contiguous) for a grouped weight's blocks; into out
    (contiguous float32 [rows, n], e.g. a row slice of a larger output) where given. x may be bfloat16 (contiguous):
    rows already rounded, as amx_glu(..., bf16=True) leaves them, which the kernel then reads as they are."""
    m, k = x.shape
    y = _output(out, m, blocks.shape[0])
    rounded = x.dtype == torch.bfloat16
    rc = _library()[0].quant_linear_amx(None if rounded else x.data_ptr(), x.data_ptr() if rounded else None,
                                        blocks.data_ptr(), TYPE_IDS[type_name],
                                        None if bias is None else bias.data_ptr(), y.data_ptr(), m,
                                        blocks.shape[0], k, threads)
    _check(rc, type_name, blocks)
    return y


def amx_glu(x: torch.Tensor, blocks: torch.Tensor, type_name: str, threads: int,
            out: torch.Tensor | None = None, bf16: bool = False) -> torch.Tensor:
    """silu(x W_gate^T) * (x W_up^T) [rows, inter] for a fused gate/up weight's grouped blocks (2 * inter rows, gate
    first; inter a multiple of 32), x [rows, k] float32 contiguous: amx_linear and silu_and_mul in one pass, the
    same bits, without the [rows, 2 * inter] product in memory; into out as amx_linear. bf16: the result as
    bfloat16, rounded as amx_linear would round it for the next linear (half the bytes, and no rounding pass there)."""
    m, k = x.shape
    y = torch.empty(m, blocks.shape[0] // 2, dtype=torch.bfloat16) if bf16 else _output(out, m, blocks.shape[0] // 2)
    _check(_library()[0].quant_glu_amx(x.data_ptr(), blocks.data_ptr(), TYPE_IDS[type_name], y.data_ptr(), m,
                                       y.shape[1], k, threads, int(bf16)), type_name, blocks)
    return y


def _output(out: torch.Tensor | None, m: int, n: int) -> torch.Tensor:
    if out is None:
        return torch.empty(m, n)
    if out.shape != (m, n) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"the AMX linear writes a contiguous float32 [{m}, {n}] output, not {out.dtype} "
                         f"{tuple(out.shape)}")
    return out


def _check(rc: int, type_name: str, blocks: torch.Tensor) -> None:
    if rc == 1:
        raise ValueError(f"the AMX linear reads whole 8-row groups of {', '.join(row_groups.BASE)} (a gate/up pair "
                         f"whole panels of 32), not {type_name} with {blocks.shape[0]} rows")
    if rc == 2:
        raise MemoryError("the AMX linear could not allocate its buffers")
    if rc == 3:
        raise RuntimeError("this build or process has no AMX tiles")
