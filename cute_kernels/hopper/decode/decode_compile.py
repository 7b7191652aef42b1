"""Compile the decode and merge kernels for one spec against fake tensors (no GPU, no data).

Every size except head_dim and the 16-token block is symbolic, so one compiled kernel serves any
batch, query tokens per sequence, head counts, cache size, block-table width and split count.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

from cute_kernels.paged_tables import KV_BLOCK_SIZE
from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel, compile_sm90

from ..common.warpgroup_ops import DTYPES
from .decode_attention import DecodeAttentionSm90
from .decode_merge import DecodeMergeSm90
from .decode_spec import DecodeMergeSpec, DecodeSpec


def _compact(dtype, shape: tuple, align: int = 16):
    order = tuple(range(len(shape) - 1, -1, -1))
    return make_fake_compact_tensor(dtype, shape, stride_order=order, assumed_align=align)


def fake_decode_arguments(spec: DecodeSpec) -> tuple:
    """Fake tensors in the argument order of DecodeAttentionSm90.__call__."""
    dtype, d = DTYPES[spec.dtype], spec.head_dim
    kv_dtype = cutlass.Float8E4M3FN if spec.fp8_kv else dtype
    total_q, heads, kv_heads, num_blocks, batch, batch_plus_1, max_blocks, splits = (
        cute.sym_int32() for _ in range(8))
    cache = lambda: _compact(kv_dtype, (num_blocks, KV_BLOCK_SIZE, kv_heads, d))  # noqa: E731
    return (
        _compact(dtype, (total_q, heads, d)), cache(), cache(),
        _compact(cutlass.Int32, (batch, max_blocks), 4), _compact(cutlass.Int32, (batch,), 4),
        _compact(cutlass.Int32, (batch_plus_1,), 4),
        _compact(dtype, (total_q, heads, d)), _compact(cutlass.Float32, (total_q, heads), 4),
        _compact(cutlass.Float32, (splits, total_q, heads, d)), _compact(cutlass.Float32, (splits, total_q, heads), 4),
        _compact(cutlass.Float32, (kv_heads,), 4), _compact(cutlass.Float32, (kv_heads,), 4),
        cutlass.Float32(1.0), cutlass.Int32(1), make_fake_stream(),
    )


def fake_merge_arguments(spec: DecodeMergeSpec) -> tuple:
    """Fake tensors in the argument order of DecodeMergeSm90.__call__."""
    dtype, d = DTYPES[spec.dtype], spec.head_dim
    splits, total_q, heads = (cute.sym_int32() for _ in range(3))
    return (
        _compact(cutlass.Float32, (splits, total_q, heads, d)), _compact(cutlass.Float32, (splits, total_q, heads), 4),
        _compact(dtype, (total_q, heads, d)), _compact(cutlass.Float32, (total_q, heads), 4), make_fake_stream(),
    )


def fake_arguments(spec: DecodeSpec | DecodeMergeSpec) -> tuple:
    return fake_decode_arguments(spec) if isinstance(spec, DecodeSpec) else fake_merge_arguments(spec)


def compile_decode(spec: DecodeSpec | DecodeMergeSpec, keep_artifacts: bool = False) -> CompiledKernel:
    """Compile either kernel for sm_90a; with keep_artifacts the PTX text and cubin bytes are returned too."""
    kernel = DecodeAttentionSm90(spec) if isinstance(spec, DecodeSpec) else DecodeMergeSm90(spec)
    args = fake_arguments(spec)
    return compile_sm90(kernel, args, spec.name, keep_artifacts)


DECODE_CACHE = CompileCache(compile_decode)
