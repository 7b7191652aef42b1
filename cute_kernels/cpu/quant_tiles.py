"""The register-blocked int8 GEMM for many activation rows (csrc/tiles/cpu_quant_tiles.c, built by build.py as
its own library beside cpu_quant_gemm): quant_gemm.quant_linear sends row counts from its crossover
on here; quant_reference.quant_linear_ref is the oracle for both."""
from __future__ import annotations

import ctypes
import time

import torch

from cute_kernels.cpu import build, row_groups
from cute_kernels.cpu.quant_blocks import TYPE_IDS

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
TILE_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # and their 8-row groups (row_groups.py)


def _reads(type_name: str) -> bool:
    return row_groups.BASE.get(type_name, type_name) in TILE_TYPES


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_quant_tiles", {
        "quant_gemm_tiles": ([_P, _C, _P, _P, _P, _P, _P, _I, _I, _I, _C], _C),
        "int8_peak": ([_I, _C], _I)})


def available(type_name: str) -> bool:
    return _reads(type_name) and _library()[0] is not None


def isa() -> str:
    """avx512-vnni, avx2 or portable-c: the micro-kernel this build runs."""
    lib = _library()[0]
    return "unavailable" if lib is None else build.isa(lib)


def tiles_gemm(blocks: torch.Tensor, type_name: str, q: torch.Tensor, d: torch.Tensor, s: torch.Tensor,
               bias: torch.Tensor | None, threads: int) -> torch.Tensor:
    """y [rows, n] from activations quantized by quantize_rows_q8 (q int8 [rows, k], d and s [rows, k/32])
    and weight blocks [n, k/32 * block bytes]; bias float32 contiguous or None."""
    if not _reads(type_name):
        raise ValueError(f"the tiles GEMM reads {', '.join(TILE_TYPES)}, not {type_name}")
    m, k = q.shape
    y = torch.empty(m, blocks.shape[0])
    rc = _library()[0].quant_gemm_tiles(
        blocks.data_ptr(), TYPE_IDS[type_name], q.data_ptr(), d.data_ptr(), s.data_ptr(),
        None if bias is None else bias.data_ptr(), y.data_ptr(), m, blocks.shape[0], k, threads)
    if rc == 2:
        raise ValueError(f"the tiles GEMM does not read {type_name}")
    if rc != 0:
        raise MemoryError("quant_gemm_tiles could not allocate its weight panel")
    return y


def int8_peak_gops(threads: int, seconds: float = 0.3, clock=time.perf_counter) -> float | None:
    """This route's int8 multiply-add peak in GOP/s (2 ops per multiply-add) on `threads` threads, from
    csrc/tiles/cpu_quant_tiles.c's int8_peak (12 independent vpdpbusd / maddubs per round); None where the
    route has no such instruction (portable C). clock: time.process_time counts CPU time, steadier on
    a shared machine (then the figure is per CPU-second, as bench_quant_gemm.py's --clock cpu rates)."""
    lib = _library()[0]
    if lib is None or lib.int8_peak(1, 1) < 0:
        return None
    iters, best = 1 << 16, 0.0
    while True:
        t0 = clock()
        macs = lib.int8_peak(iters, threads)
        dt = clock() - t0
        best = max(best, 2 * macs / dt / 1e9)
        if dt >= seconds:
            return best
        iters *= 2
