"""FlashAttention-style varlen prefill attention for Hopper (sm_90a), in the CuTe DSL.

Contract: the same as reference.prefill_attention_ref (packed [tokens, heads, d] q/k/v,
cu_seqlens, paged prefix through 16-token block tables, bottom-right causal, GQA by head ratio),
plus an fp32 LSE [total_q, heads] output.

Design (one CTA = 128 packed query rows of one KV head of one sequence, 2 MMA warpgroups):
- Packed GQA: rows are (token, query head of this KV head), so each K/V tile is loaded once per group.
- K/V rows are gathered with cp.async (16 B per thread-copy): a tile may straddle the paged prefix
  (block_tables -> cache block, slot) and the packed new keys, and 16-token blocks are too small for
  TMA boxes of 128 rows. Rows past the sequence end are clamped to its last key (finite data, masked
  to -inf in S, exact zeros in P), so no zero-fill or predication is needed.
- S = Q K^T with SS wgmma, O += P V with RS wgmma (P stays in registers), fp32 accumulation.
- Online softmax in fp32 with exp2, running max / sum per row; key tiles are visited from the last
  to the first so only the first few (diagonal / ragged) tiles pay for masking, and tiles beyond
  the causal frontier are never loaded.
- Pipeline: V[n] streams in during S = QK[n] and the softmax, K[n-1] during O += PV[n].
"""
from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.memory
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from .prefill_schedule import kv_block_range, key_row_coords, packed_row_token_head, query_key_position
from .prefill_spec import KV_BLOCK_SIZE, PrefillSpec
from .warpgroup_ops import (
    DTYPES, attention_tiled_mmas, copy_row_chunk, online_softmax, quad_allreduce_sum, make_row_copy, row_lse,
    swizzled_rows_layout, wgmma,
)
from .wgmma_layouts import acc_as_rows_cols, acc_as_operand_a


class PrefillAttentionSm90:
    """Compile-time configuration + host launch (__call__) + kernel body."""

    def __init__(self, spec: PrefillSpec):
        self.spec = spec
        self.dtype = DTYPES[spec.dtype]
        self.head_dim = spec.head_dim
        self.group = spec.qheads_per_kvhead
        self.causal = spec.causal
        tile = spec.tile
        self.tile_m, self.tile_n = tile.tile_m, tile.tile_n
        self.num_threads = tile.num_threads
        self.num_wg = tile.num_mma_warpgroups
        assert self.tile_m == 64 * self.num_wg

    # ------------------------------------------------------------------ configuration
    def _smem_layout(self, rows: int):
        return swizzled_rows_layout(self.dtype, self.head_dim, (rows, self.head_dim))

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [total_q, H, d]
        mK: cute.Tensor,  # [total_k, Hkv, d]
        mV: cute.Tensor,  # [total_k, Hkv, d]
        mKCache: cute.Tensor,  # [num_blocks, 16, Hkv, d]
        mVCache: cute.Tensor,  # [num_blocks, 16, Hkv, d]
        mBlockTables: cute.Tensor,  # [B, max_blocks] int32
        mPrefixLens: cute.Tensor,  # [B] int32
        mCuSeqlensQ: cute.Tensor,  # [B + 1] int32
        mCuSeqlensK: cute.Tensor,  # [B + 1] int32
        mO: cute.Tensor,  # [total_q, H, d]
        mLSE: cute.Tensor,  # [total_q, H] fp32
        softmax_scale_log2: Float32,
        max_seqlen_q: Int32,
        stream: cuda.CUstream,
    ):
        mma_qk, mma_pv = attention_tiled_mmas(self.dtype, self.head_dim, self.tile_n, self.num_wg)
        sQ_layout = self._smem_layout(self.tile_m)
        sKV_layout = self._smem_layout(self.tile_n)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        num_m_blocks = (max_seqlen_q * self.group + self.tile_m - 1) // self.tile_m
        batch = mCuSeqlensQ.shape[0] - 1
        num_kv_heads = mK.shape[1]
        self.kernel(
            mQ, mK, mV, mKCache, mVCache, mBlockTables, mPrefixLens, mCuSeqlensQ, mCuSeqlensK, mO, mLSE,
            softmax_scale_log2, sQ_layout, sKV_layout, mma_qk, mma_pv,
            make_row_copy(self.dtype, self.head_dim, self.num_threads), SharedStorage,
        ).launch(
            grid=[num_m_blocks, num_kv_heads, batch],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKCache: cute.Tensor,
        mVCache: cute.Tensor,
        mBlockTables: cute.Tensor,
        mPrefixLens: cute.Tensor,
        mCuSeqlensQ: cute.Tensor,
        mCuSeqlensK: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        softmax_scale_log2: Float32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        mma_qk: cute.TiledMma,
        mma_pv: cute.TiledMma,
        row_copy: cute.TiledCopy,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        m_block, kv_head, batch_idx = cute.arch.block_idx()

        q_start = mCuSeqlensQ[batch_idx]
        q_len = mCuSeqlensQ[batch_idx + 1] - q_start
        k_start = mCuSeqlensK[batch_idx]
        prefix_len = mPrefixLens[batch_idx]
        seqlen_k = prefix_len + mCuSeqlensK[batch_idx + 1] - k_start

        # Tiles past this sequence's packed rows have no work (the grid covers the longest one).
        if m_block * self.tile_m < q_len * self.group:
            smem = cutlass.memory.SmemAllocator()
            storage = smem.allocate(SharedStorage)
            sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
            sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
            # V^T view [d, keys] for the PV B operand (same bytes, MN-major).
            sVt = cute.composition(
                sV, cute.make_ordered_layout((self.head_dim, self.tile_n), order=(1, 0))
            )

            n_block_max, n_mask_start = kv_block_range(
                m_block, q_len, seqlen_k, self.group, self.tile_m, self.tile_n, self.causal,
                imin=cutlass.min, imax=cutlass.max,
            )
            n_mask_start = cutlass.max(n_mask_start, 0)

            thr_copy = row_copy.get_slice(tidx)
            ctx = _TileContext(
                q_start, q_len, k_start, prefix_len, seqlen_k, kv_head, m_block, batch_idx,
            )

            # Prologue: Q, then the last needed K tile.
            self.load_q(mQ, sQ, thr_copy, row_copy, ctx)
            cute.arch.cp_async_commit_group()
            if n_block_max > 0:
                self.load_kv(mK, mKCache, mBlockTables, sK, thr_copy, row_copy, ctx, n_block_max - 1)
            cute.arch.cp_async_commit_group()

            thr_mma_qk = mma_qk.get_slice(tidx)
            thr_mma_pv = mma_pv.get_slice(tidx)
            tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
            tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
            tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt))
            acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
            acc_O.fill(0.0)
            row_max = cute.make_rmem_tensor((cute.size(acc_as_rows_cols(acc_O), mode=[0]),), Float32)
            row_sum = cute.make_rmem_tensor_like(row_max)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            # Packed-row coordinate of each accumulator row this thread holds.
            tScS = thr_mma_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
            tScS_rc = acc_as_rows_cols(tScS)

            step_args = (
                mK, mV, mKCache, mVCache, mBlockTables, sK, sV, thr_copy, row_copy, ctx,
                mma_qk, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrVt, acc_O, row_max, row_sum, tScS_rc,
                softmax_scale_log2,
            )
            # Masked tiles first (the diagonal / ragged end), then the fully visible ones.
            for i in cutlass.range(n_block_max - n_mask_start, unroll=1):
                self.step(n_block_max - 1 - i, True, *step_args)
            for i in cutlass.range(cutlass.min(n_mask_start, n_block_max), unroll=1):
                self.step(cutlass.min(n_mask_start, n_block_max) - 1 - i, False, *step_args)

            self.epilogue(mO, mLSE, acc_O, row_max, row_sum, thr_mma_pv, ctx, softmax_scale_log2)

    # ------------------------------------------------------------------ loads
    @cute.jit
    def load_q(self, mQ, sQ, thr_copy, row_copy, ctx):
        """cp.async the tile's packed Q rows; rows past q_len repeat the last token (never stored)."""
        tQsQ = thr_copy.partition_D(sQ)
        tQcQ = thr_copy.partition_S(cute.make_identity_tensor((self.tile_m, self.head_dim)))
        for i in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            coord = tQcQ[0, i, 0]
            row = ctx.m_block * self.tile_m + coord[0]
            token, head = packed_row_token_head(row, ctx.kv_head, self.group)
            token = cutlass.min(token, ctx.q_len - 1)
            offset = (Int64(ctx.q_start + token) * Int64(mQ.stride[0]) + Int64(head) * Int64(mQ.stride[1])
                      + Int64(coord[1]))
            copy_row_chunk(row_copy, self.dtype, mQ, offset, tQsQ[None, i, 0])

    @cute.jit
    def load_kv(self, mX, mXCache, mBlockTables, sX, thr_copy, row_copy, ctx, n_block: Int32):
        """cp.async key tile n_block of K or V: prefix rows from the paged cache, the rest from the
        packed new rows; rows past seqlen_k are clamped to the last key (masked later)."""
        tXsX = thr_copy.partition_D(sX)
        tXcX = thr_copy.partition_S(cute.make_identity_tensor((self.tile_n, self.head_dim)))
        for i in cutlass.range_constexpr(cute.size(tXsX, mode=[1])):
            coord = tXcX[0, i, 0]
            key_pos = cutlass.min(n_block * self.tile_n + coord[0], ctx.seqlen_k - 1)
            block_col, slot, new_row = key_row_coords(key_pos, ctx.prefix_len, ctx.k_start, KV_BLOCK_SIZE)
            col = Int64(coord[1])
            if key_pos < ctx.prefix_len:
                block = Int64(mBlockTables[ctx.batch_idx, block_col])
                offset = (block * Int64(mXCache.stride[0]) + Int64(slot) * Int64(mXCache.stride[1])
                          + Int64(ctx.kv_head) * Int64(mXCache.stride[2]) + col)
                copy_row_chunk(row_copy, self.dtype, mXCache, offset, tXsX[None, i, 0])
            else:
                offset = (Int64(new_row) * Int64(mX.stride[0]) + Int64(ctx.kv_head) * Int64(mX.stride[1])
                          + col)
                copy_row_chunk(row_copy, self.dtype, mX, offset, tXsX[None, i, 0])

    # ------------------------------------------------------------------ main loop
    @cute.jit
    def step(
        self, n_block: Int32, masked: cutlass.Constexpr,
        mK, mV, mKCache, mVCache, mBlockTables, sK, sV, thr_copy, row_copy, ctx,
        mma_qk, mma_pv, thr_mma_qk, tSrQ, tSrK, tOrVt, acc_O, row_max, row_sum, tScS_rc,
        softmax_scale_log2: Float32,
    ):
        # K[n] (and Q) landed; everyone is done reading V from the previous step.
        self._wait_loads_and_sync()
        self.load_kv(mV, mVCache, mBlockTables, sV, thr_copy, row_copy, ctx, n_block)
        cute.arch.cp_async_commit_group()

        acc_S = cute.make_rmem_tensor(thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n)), Float32)
        wgmma(mma_qk, acc_S, tSrQ, tSrK, zero_init=True)

        if const_expr(masked):
            self.apply_mask(acc_S, tScS_rc, n_block, ctx)
        online_softmax(acc_S, acc_O, row_max, row_sum, softmax_scale_log2)
        tOrP = cute.make_rmem_tensor_like(acc_as_operand_a(acc_S), self.dtype)
        tOrP.store(acc_as_operand_a(acc_S).load().to(self.dtype))

        # V[n] landed; everyone is done reading K[n], so K[n-1] may overwrite it.
        self._wait_loads_and_sync()
        if n_block > 0:
            self.load_kv(mK, mKCache, mBlockTables, sK, thr_copy, row_copy, ctx, n_block - 1)
        cute.arch.cp_async_commit_group()
        wgmma(mma_pv, acc_O, tOrP, tOrVt, zero_init=False)

    @cute.jit
    def _wait_loads_and_sync(self):
        cute.arch.cp_async_wait_group(0)
        # cp.async writes are generic-proxy; wgmma reads shared memory through the async proxy.
        cute.arch.fence_view_async_shared()
        cute.arch.sync_threads()

    @cute.jit
    def apply_mask(self, acc_S, tScS_rc, n_block: Int32, ctx):
        """-inf for keys past seqlen_k and, if causal, past each row's key position."""
        s = acc_as_rows_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            row = ctx.m_block * self.tile_m + tScS_rc[r, 0][0]
            key_limit = ctx.seqlen_k
            if const_expr(self.causal):
                token = row // self.group
                key_limit = cutlass.min(query_key_position(token, ctx.q_len, ctx.seqlen_k) + 1, ctx.seqlen_k)
            col_limit = key_limit - n_block * self.tile_n
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                if tScS_rc[0, c][1] >= col_limit:
                    s[r, c] = -Float32.inf

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def epilogue(self, mO, mLSE, acc_O, row_max, row_sum, thr_mma_pv, ctx, softmax_scale_log2: Float32):
        """O /= row sum, store valid rows to [q_start + token, head, :]; LSE in natural log."""
        o = acc_as_rows_cols(acc_O)
        tOcO = acc_as_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        lane = cute.arch.lane_idx()
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            total = quad_allreduce_sum(row_sum[r])
            inv = 1.0 / total if total > 0.0 else Float32(0.0)
            row = ctx.m_block * self.tile_m + tOcO[r, 0][0]
            token, head = packed_row_token_head(row, ctx.kv_head, self.group)
            if token < ctx.q_len:
                q_row = ctx.q_start + token
                vals = (o[r, None].load() * inv).to(self.dtype)
                out = cute.make_rmem_tensor_like(o[r, None], self.dtype)
                out.store(vals)
                for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                    mO[q_row, head, tOcO[0, c][1]] = out[c]
                if lane % 4 == 0:
                    mLSE[q_row, head] = row_lse(row_max[r], total, softmax_scale_log2)


class _TileContext:
    """Per-CTA runtime scalars passed between the kernel's helpers."""

    def __init__(self, q_start, q_len, k_start, prefix_len, seqlen_k, kv_head, m_block, batch_idx):
        self.q_start, self.q_len, self.k_start = q_start, q_len, k_start
        self.prefix_len, self.seqlen_k = prefix_len, seqlen_k
        self.kv_head, self.m_block, self.batch_idx = kv_head, m_block, batch_idx
