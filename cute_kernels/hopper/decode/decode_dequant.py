"""Dequantize one e4m3 K or V tile in shared memory into the 16-bit tile the decode wgmmas read.

Why not an FP8 wgmma: QGMMA takes both operands K-major and in e4m3. S = Q K^T would need Q
quantized to e4m3 (3 mantissa bits on the query: an error the bf16 cache does not have), and O = P V
reads V MN-major (d contiguous), which fp8 wgmma does not take without a transpose in shared memory.
Decode is bandwidth-bound and the tensor cores idle most of a tile, so converting the bytes costs
nothing the HBM wait does not hide; the bf16 math stays exactly the bf16 cache's.
Scales: one per (layer, KV head) and a CTA is one KV head, so they are CTA-wide scalars folded into
the softmax scale (K) and the output's normalization (V) instead of multiplied into every element.
e4m3 values are exact in bf16 and fp16, so the converted tile equals the stored bytes.

Each consumer thread moves 16 e4m3 values of one row (one 16-byte LDS) into 16 16-bit values (two
16-byte STS); both layouts are GMMA-swizzled at 16-byte granularity, so the vectors stay whole.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

FP8_PER_VECTOR = 16  # e4m3 values in one 16-byte shared-memory load


def make_dequant_copies(kv_dtype, dtype, head_dim: int, num_threads: int):
    """(load, store) tiled copies over [rows, head_dim]: thread t holds 16 consecutive values of a row."""
    chunks_per_row = head_dim // FP8_PER_VECTOR
    thr_layout = cute.make_ordered_layout((num_threads // chunks_per_row, chunks_per_row), order=(1, 0))
    val_layout = cute.make_layout((1, FP8_PER_VECTOR))
    load = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), kv_dtype, num_bits_per_copy=128)
    store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return (cute.make_tiled_copy_tv(load, thr_layout, val_layout),
            cute.make_tiled_copy_tv(store, thr_layout, val_layout))


def staged_elems(fp8: bool, stage_layout) -> int:
    """Elements of one dequantized tile: only an e4m3 cache needs it (a token 16 B otherwise)."""
    return cute.cosize(stage_layout) if fp8 else 8


def staged_align(fp8: bool) -> int:
    """The GMMA swizzle's 1024 B for a real tile; 16 B for the token, so that a 16-bit cache's
    kernel keeps its 2 CTAs per SM (1 KiB of padding each would break the plan at d = 128)."""
    return 1024 if fp8 else 16


@cute.jit
def dequant_tile(load_copy: cute.TiledCopy, store_copy: cute.TiledCopy, src: cute.Tensor, dst: cute.Tensor,
                 tidx, dtype: cutlass.Constexpr):
    """dst[rows, d] = src[rows, d] converted to dtype (both shared memory, same logical shape)."""
    tS = load_copy.get_slice(tidx).partition_S(src)
    tD = store_copy.get_slice(tidx).partition_D(dst)
    for i in cutlass.range_constexpr(cute.size(tS, mode=[1])):
        for j in cutlass.range_constexpr(cute.size(tS, mode=[2])):
            raw = cute.make_rmem_tensor_like(tS[None, i, j])
            cute.copy(load_copy, tS[None, i, j], raw)
            wide = cute.make_rmem_tensor_like(tD[None, i, j])
            wide.store(raw.load().to(dtype))
            cute.copy(store_copy, wide, tD[None, i, j])
