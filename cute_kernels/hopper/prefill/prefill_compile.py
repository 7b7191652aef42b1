"""Compile the prefill kernel for one PrefillSpec against fake tensors (no GPU, no data).

Every size except head_dim and the 16-token block is symbolic, so one compiled kernel serves any
batch, sequence lengths, head counts, cache size and block-table width. Strides are 64-bit.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

from cute_kernels.toolchain.compile_cache import CompileCache, CompiledKernel, compile_sm90

from .prefill_attention import DTYPES, PrefillAttentionSm90
from .prefill_spec import KV_BLOCK_SIZE, PrefillSpec
from .prefill_tile_order import CPU_COMPILE_SMS


def fake_prefill_arguments(spec: PrefillSpec) -> tuple:
    """Fake tensors in the argument order of PrefillAttentionSm90.__call__."""
    dtype, d = DTYPES[spec.dtype], spec.head_dim
    total_q, total_k, heads, kv_heads = (cute.sym_int32() for _ in range(4))
    num_blocks, batch, batch_plus_1, max_blocks = (cute.sym_int32() for _ in range(4))

    def rows(n_rows, n_heads):  # packed [tokens, heads, d], rows 16-byte aligned
        return make_fake_compact_tensor(dtype, (n_rows, n_heads, d), stride_order=(2, 1, 0), assumed_align=16)

    def cache():
        return make_fake_compact_tensor(
            cutlass.Float8E4M3FN if spec.fp8_kv else dtype, (num_blocks, KV_BLOCK_SIZE, kv_heads, d),
            stride_order=(3, 2, 1, 0), assumed_align=16,
        )

    def int32(*shape):
        order = tuple(range(len(shape) - 1, -1, -1))
        return make_fake_compact_tensor(cutlass.Int32, shape, stride_order=order, assumed_align=4)

    q, k, v, o = rows(total_q, heads), rows(total_k, kv_heads), rows(total_k, kv_heads), rows(total_q, heads)
    lse = make_fake_compact_tensor(cutlass.Float32, (total_q, heads), stride_order=(1, 0), assumed_align=4)
    return (
        q, k, v, cache(), cache(), int32(batch, max_blocks), int32(batch), int32(batch_plus_1),
        int32(batch_plus_1), o, lse, int32(cute.sym_int32()),
        make_fake_compact_tensor(cutlass.Float32, (kv_heads,), stride_order=(0,), assumed_align=4),
        make_fake_compact_tensor(cutlass.Float32, (kv_heads,), stride_order=(0,), assumed_align=4),
        cutlass.Float32(1.0), cutlass.Int32(1),
        cutlass.Int32(CPU_COMPILE_SMS), make_fake_stream(),
    )


def compile_prefill(spec: PrefillSpec, keep_artifacts: bool = False) -> CompiledKernel:
    """Compile for sm_90a; with keep_artifacts the PTX text and cubin bytes are returned too."""
    kernel = PrefillAttentionSm90(spec)
    args = fake_prefill_arguments(spec)
    return compile_sm90(kernel, args, spec.name, keep_artifacts)


PREFILL_CACHE = CompileCache(compile_prefill)
