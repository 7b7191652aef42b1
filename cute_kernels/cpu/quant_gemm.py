"""Quantized linear layers on the CPU: csrc/cpu_quant_gemm.c (built by build.py) over weights in
ggml block formats (quant_blocks.py), and csrc/cpu_kquant_gemm.c over the K-quant super-blocks
(kquant_blocks.py), fed the same int8 activation blocks; quant_reference.quant_linear_ref is their oracle.

The activations are quantized once per call (int8 blocks of 32), so a fused weight (q/k/v,
gate/up) shares them; where the library cannot be built, quant_linear runs the reference.

The paths, chosen per call by row count (choose_path, TILES_ROWS): the GEMV here for decode rows,
where reading 4.5-bit instead of 32-bit weights is the gain; from a few rows on the register-blocked
int8 GEMM of quant_tiles.py (cpu_quant_tiles.c), which packs weight panels so that one instruction
serves 8 output columns; and, where that kernel has no SIMD build (portable C) or does not read the
type (the K-quants), from DEQUANT_MIN_ROWS rows on, the weight dequantized a slice of at most DEQUANT_SLICE_ROWS output rows at a time into one
reused buffer and multiplied by torch's fp32 GEMM. On CPUs with AMX a fourth, from AMX_MIN_ROWS rows on: grouped
weights dequantized a panel at a time to bf16 and multiplied on the AMX tiles (quant_amx.py). (This GEMV's int8 dot products, with a horizontal
sum per 32 values, do no better than fp32 FMAs on many rows: 27 vs 31 ms for a 3072x576 Q4_1 weight
at 128 rows on one AVX2 core.)
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from cute_kernels.cpu import build, kquant_blocks, quant_amx, quant_tiles, row_groups
from cute_kernels.cpu.quant_blocks import QK, TYPE_IDS, block_values, row_bytes
from cute_kernels.cpu.quant_reference import quant_linear_ref

_P, _I, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
DEQUANT_MIN_ROWS = 128
# (tiles ISA, type) -> (first row count for quant_tiles' GEMM, first for dequantize + fp32 GEMM). From
# profiling/benchmarks/bench_quant_gemm.py --threads 1 --clock cpu on a busy 2-core AVX2 machine (Zen 3) the GEMM
# passes this GEMV at 8 rows for Q4 (Q8_0: 16) and is 1.2-3.0x fp32 F.linear for Q4_1 (Q8_0: 1.2-2.1x)
# at 16-512 rows, where dequantize + fp32 is 0.4-1.0x; so on AVX2 Q4 never takes the dequantized route.
# Q8_0 (the default model's tied LM head, 49152 rows): the GEMM from 16 rows, 1.5-1.8x the GEMV there
# (bench_quant_gemm.py --types Q8_0 --shapes head --clock cpu). An earlier engine run that looked ~10x
# slower with the head here was the shared machine: back-to-back runs of one route swing 10x under load
# (OpenMP threads spin at barriers while another process holds a core).
# The VNNI entries copy AVX2's (no such CPU was at hand), the portable build keeps the old routes.
OLD_ROUTES = (1 << 62, DEQUANT_MIN_ROWS)
TILES_ROWS = {**{(isa, t): (8, 1 << 62) for isa in ("avx2", "avx512-vnni") for t in ("Q4_0", "Q4_1")},
              **{(isa, "Q8_0"): (16, 1 << 62) for isa in ("avx2", "avx512-vnni")},
              **{("portable-c", t): OLD_ROUTES for t in ("Q4_0", "Q4_1", "Q8_0")}}
# Below this many multiply-adds a product stays on the calling thread: a small GEMV takes tens of
# microseconds, and joining threads costs more than it saves whenever another process holds a core.
PARALLEL_MIN_MACS = 1 << 20
DEQUANT_SLICE_ROWS = 4096
# From this many rows a grouped weight takes the AMX tiles on CPUs that have them (quant_amx.py): 2 threads,
# Q4_1 and Q8_0 weights 3072x576, 576x1536, 960x576, 576x576, the AMX linear against the int8 tiles was
# 0.67-1.41x at 8 rows, 1.09-1.70x at 32 and 1.27-1.89x at 64 (its panel packing, ~0.26 ms for
# 3072x576, is what small row counts pay); 2.0-2.4x at 2048 rows.
AMX_MIN_ROWS = 32


def _signatures() -> dict:
    return {"quantize_rows_q8": ([_P, _I, _I, _P, _P, _P, _C], None),
            "quant_gemm": ([_P, _C, _P, _P, _P, _P, _P, _I, _I, _I, _C], None),
            "dequantize_blocks": ([_P, _C, _I, _I, _P, _C], None)}


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_quant_gemm", _signatures())


def _kquant_library() -> tuple[ctypes.CDLL | None, str | None]:
    names = {"kquant_gemm": "quant_gemm", "kquant_dequantize": "dequantize_blocks"}
    return build.load_with_signatures("cpu_kquant_gemm", {k: _signatures()[v] for k, v in names.items()})


def _gemm_and_dequantize(type_name: str) -> tuple | None:
    """(gemm, dequantize, type id) of the library that reads type_name's blocks; None where it is not built."""
    if type_name in kquant_blocks.TYPE_IDS:
        lib = _kquant_library()[0]
        return None if lib is None else (lib.kquant_gemm, lib.kquant_dequantize, kquant_blocks.TYPE_IDS[type_name])
    lib = _library()[0]
    return None if lib is None else (lib.quant_gemm, lib.dequantize_blocks, TYPE_IDS[type_name])


def unavailable_reason() -> str | None:
    """None when both C libraries are built and loaded; otherwise why not."""
    return _library()[1] or _kquant_library()[1]


def isa() -> str:
    """Which dot-product path the built libraries run: avx512-vnni, avx2 or portable-c."""
    lib, klib = _library()[0], _kquant_library()[0]
    if lib is None or klib is None:
        return "torch reference"
    assert build.isa(lib) == build.isa(klib)  # one header chooses for both
    return build.isa(lib)


def supports(type_name: str, rows: int, cols: int) -> bool:
    known = type_name in TYPE_IDS or type_name in kquant_blocks.TYPE_IDS
    whole_groups = type_name not in row_groups.BASE or rows % row_groups.GROUP_ROWS == 0
    return known and cols % block_values(type_name) == 0 and rows > 0 and whole_groups


def gemv_layout(type_name: str, blocks: torch.Tensor) -> tuple[str, torch.Tensor]:
    """(type, blocks) of a weight as this build's kernels read it fastest: Q4_0, Q4_1 and Q8_0 weights of
    whole 8-row groups grouped (row_groups.py; the same bits, ~1.3-1.9x the GEMV's rate) on the SIMD
    routes; the file's layout elsewhere (the portable C would re-assemble every block it reads)."""
    if (row_groups.groupable(type_name, blocks.shape[0]) and _library()[0] is not None
            and isa() in ("avx2", "avx512-vnni")):
        return row_groups.GROUPED[type_name], row_groups.group(blocks, type_name)
    return type_name, blocks


def tiles_from(type_name: str) -> int | None:
    """The fewest activation rows that take quant_tiles' GEMM for this weight type (None: never)."""
    if not quant_tiles.available(type_name):
        return None
    first = TILES_ROWS[quant_tiles.isa(), row_groups.BASE.get(type_name, type_name)][0]
    return None if first >= OLD_ROUTES[0] else first


def choose_path(type_name: str, rows: int, allow_dequant: bool = True) -> str:
    """gemv, tiles, amx or dequant: the fastest measured path for this many activation rows on this build.
    gemv and tiles give a row the same bits; amx and dequant round otherwise (allow_dequant=False: never)."""
    if rows >= AMX_MIN_ROWS and allow_dequant and quant_amx.reads(type_name) and quant_amx.available():
        return "amx"
    if not quant_tiles.available(type_name):
        return "dequant" if rows >= DEQUANT_MIN_ROWS and allow_dequant else "gemv"
    tiles_from, dequant_from = TILES_ROWS[quant_tiles.isa(), row_groups.BASE.get(type_name, type_name)]
    if rows >= dequant_from and allow_dequant:
        return "dequant"
    return "tiles" if rows >= tiles_from else "gemv"


def quant_linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None,
                 path: str | None = None) -> torch.Tensor:
    """x [rows, k] float32 @ W^T (+ bias) for W given as blocks [n, row_bytes(type_name, k)] of type_name;
    path (gemv, tiles, amx, dequant) overrides choose_path, for tests and benchmarks."""
    lib, kernels = _library()[0], _gemm_and_dequantize(type_name)
    n, k = blocks.shape[0], x.shape[-1]
    if (lib is None or kernels is None or x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2
            or blocks.shape[1] != row_bytes(type_name, k) or not blocks.is_contiguous()
            or not supports(type_name, n, k)):
        return quant_linear_ref(x, blocks, type_name, bias)
    x = x.contiguous()
    path = path or choose_path(type_name, x.shape[0])
    if path == "dequant":
        return _dequantized_linear(x, blocks, type_name, bias)
    m = x.shape[0]
    threads = torch.get_num_threads() if m * n * k >= PARALLEL_MIN_MACS else 1
    if path == "amx":
        return quant_amx.amx_linear(x, blocks, type_name, None if bias is None else bias.float().contiguous(), threads)
    q = torch.empty(m, k, dtype=torch.int8)
    d, s = torch.empty(m, k // QK), torch.empty(m, k // QK)
    # one thread: under 128 rows this is ~0.1 ms, less than a thread join costs on a shared machine
    lib.quantize_rows_q8(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), s.data_ptr(), 1 if m < 128 else threads)
    bias = None if bias is None else bias.float().contiguous()  # held: the kernel reads it
    if path == "tiles":
        return quant_tiles.tiles_gemm(blocks, type_name, q, d, s, bias, threads)
    y = torch.empty(m, n)
    bias_ptr = None if bias is None else bias.data_ptr()
    gemm, _, type_id = kernels
    gemm(blocks.data_ptr(), type_id, q.data_ptr(), d.data_ptr(), s.data_ptr(), bias_ptr, y.data_ptr(), m, n, k,
         threads)
    return y


_scratch: list[torch.Tensor] = [torch.empty(0)]  # one buffer, grown as needed: steps run one at a time


def _dequantized_linear(x: torch.Tensor, blocks: torch.Tensor, type_name: str,
                        bias: torch.Tensor | None) -> torch.Tensor:
    n, k = blocks.shape[0], x.shape[1]
    slice_rows = min(n, DEQUANT_SLICE_ROWS)
    if _scratch[0].numel() < slice_rows * k:
        _scratch[0] = torch.empty(slice_rows * k)
    y = torch.empty(x.shape[0], n)
    for start in range(0, n, slice_rows):
        rows = blocks[start:start + slice_rows]
        w = dequantize_c(rows, type_name, k, _scratch[0][:rows.shape[0] * k].view(rows.shape[0], k))
        y[:, start:start + rows.shape[0]] = F.linear(x, w, None if bias is None else bias[start:start + rows.shape[0]])
    return y


def dequantize_c(blocks: torch.Tensor, type_name: str, cols: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 values [rows, cols] of blocks, by the C library (same values as quant_blocks.dequantize)."""
    out = torch.empty(blocks.shape[0], cols) if out is None else out
    _, dequantize, type_id = _gemm_and_dequantize(type_name)
    dequantize(blocks.data_ptr(), type_id, blocks.shape[0], cols, out.data_ptr(), torch.get_num_threads())
    return out
