"""Paged split-KV decode attention for Hopper (sm_90a), in the CuTe DSL.

Contract: reference.decode_attention_ref (q [tokens, heads, d] over each sequence's first
context_lens[b] cached tokens; several query tokens per sequence for speculative verification,
bottom-right causal among them), plus the natural-log LSE; with several splits, the fp32 partial
output and LSE of each split, which decode_merge.py combines.

Design: one CTA = one (split, KV head, sequence); 4 consumer warps (one warpgroup) + 1 producer warp.
- Packed GQA: the CTA's 64 query rows are (query token, query head of this KV head), so each K/V
  byte is read once for the whole group (rows past q_len * group are padding, never stored).
- Decode is bandwidth-bound: the kernel's job is to keep K/V streaming. The producer warp issues
  TMA copies of whole cache blocks: the cache [num_blocks, 16, kv_heads, d] is viewed as
  (slot, d, kv_head, block) and a box is one head's 16 rows (at stride kv_heads * d) by one 128-byte
  swizzle span of d (one box per block and tensor at d = 64, two at d = 128), so there is no per-row
  copy, the GMMA swizzle is written by the copy engine, addressing is 64-bit in hardware and the block
  id is just a coordinate. 4 blocks make a stage of a 3-6 stage ring completed on mbarriers
  (PipelineTmaAsync). Block-table entries are read 32 at a time by the producer's lanes, one group
  ahead of use, and shuffled out.
- Math on the tensor cores with warpgroup MMA: the group is padded to M = 64 rows. The FLOPs are
  wasted but free (a tile's two wgmmas take a fraction of the time its 16-32 KiB take to arrive),
  and the consumer warps stay mostly idle, waiting on the next stage: per-warp mma.sync or FMA
  would cost more issue slots for the same bytes.
- Cache slots past the context (the last block's tail) may hold anything, NaN included: their
  scores are masked by select, and their V rows zeroed in shared memory, since 0 * NaN is NaN.
- An e4m3 cache (spec.fp8_kv) streams half the bytes: the ring holds e4m3 blocks (TMA boxes of 16
  rows x d bytes, 128 B or 64 B swizzled), each tile is dequantized into one 16-bit K and V tile the
  same wgmmas read (decode_dequant.py says why not an FP8 wgmma), and the per-head scales are folded
  into the softmax scale (K) and the output's normalization (V).
- The index arithmetic (split ranges, table columns and lanes, masks, the merge's weights) lives in
  decode_schedule.py, which the CPU emulation and the protocol model (hopper/protocol) call too.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync

from cute_kernels.paged_tables import KV_BLOCK_SIZE

from ..common.warpgroup_ops import (
    DTYPES,
    attention_tiled_mmas,
    copy_row_chunk,
    make_row_copy,
    online_softmax,
    quad_allreduce_sum,
    row_lse,
    swizzled_rows_layout,
    wgmma,
)
from ..common.wgmma_layouts import acc_as_operand_a, acc_as_rows_cols
from . import decode_schedule as sched
from .decode_dequant import dequant_tile, make_dequant_copies, staged_align, staged_elems
from .decode_spec import BLOCKS_PER_TILE, KEYS_PER_TILE, QUERY_ROWS, DecodeSpec

CONSUMER_THREADS = 128  # one warpgroup
PRODUCER_WARP = CONSUMER_THREADS // 32
CONSUMER_BARRIER = 1  # named barrier among the consumer warps only (0 is __syncthreads)


class DecodeAttentionSm90:
    """Compile-time configuration + host launch (__call__) + kernel body."""

    def __init__(self, spec: DecodeSpec):
        self.spec = spec
        self.dtype = DTYPES[spec.dtype]
        self.fp8 = spec.fp8_kv
        self.kv_dtype = cutlass.Float8E4M3FN if self.fp8 else self.dtype
        self.head_dim = spec.head_dim
        self.stages = spec.stages
        self.num_threads = CONSUMER_THREADS + 32

    # ------------------------------------------------------------------ configuration
    def _cache_tma(self, mCache: cute.Tensor, block_layout):
        """TMA atom over the cache viewed as (slot, d, kv_head, block): a box is one head's 16 x d block."""
        view = cute.make_tensor(mCache.iterator, cute.select(mCache.layout, mode=[1, 3, 2, 0]))
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), view, block_layout, (KV_BLOCK_SIZE, self.head_dim)
        )

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [total_q, H, d]
        mKCache: cute.Tensor,  # [num_blocks, 16, Hkv, d]
        mVCache: cute.Tensor,
        mBlockTables: cute.Tensor,  # [B, max_blocks] int32
        mContextLens: cute.Tensor,  # [B] int32, keys per sequence (its query tokens' included)
        mCuSeqlensQ: cute.Tensor,  # [B + 1] int32
        mO: cute.Tensor,  # [total_q, H, d]: written when num_splits == 1
        mLSE: cute.Tensor,  # [total_q, H] fp32: written when num_splits == 1
        mOPartial: cute.Tensor,  # [splits, total_q, H, d] fp32: written when num_splits > 1
        mLSEPartial: cute.Tensor,  # [splits, total_q, H] fp32
        mKScale: cute.Tensor,  # [Hkv] fp32: dequantized K = stored * scale (read with an e4m3 cache only)
        mVScale: cute.Tensor,  # [Hkv] fp32
        softmax_scale_log2: Float32,
        num_splits: Int32,
        stream: cuda.CUstream,
    ):
        mma_qk, mma_pv = attention_tiled_mmas(self.dtype, self.head_dim, KEYS_PER_TILE)
        d = self.head_dim
        # Rows before column atoms: the 16 rows of one cache block in one 128 B column span are one TMA box.
        sQ_layout = swizzled_rows_layout(self.dtype, d, (QUERY_ROWS, d))
        sKV_layout = swizzled_rows_layout(self.kv_dtype, d, (KEYS_PER_TILE, d, self.stages))
        block_layout = swizzled_rows_layout(self.kv_dtype, d, (KV_BLOCK_SIZE, d))
        sStage_layout = swizzled_rows_layout(self.dtype, d, (KEYS_PER_TILE, d, 1))  # the dequantized tile
        tma_k, gK = self._cache_tma(mKCache, block_layout)
        tma_v, gV = self._cache_tma(mVCache, block_layout)

        @cute.struct
        class SharedStorage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.kv_dtype, cute.cosize(sKV_layout)], 1024]
            sKc: cute.struct.Align[cute.struct.MemRange[self.dtype, staged_elems(self.fp8, sStage_layout)],
                                   staged_align(self.fp8)]
            sVc: cute.struct.Align[cute.struct.MemRange[self.dtype, staged_elems(self.fp8, sStage_layout)],
                                   staged_align(self.fp8)]
            barriers: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]

        self.kernel(
            mQ, tma_k, gK, tma_v, gV, mBlockTables, mContextLens, mCuSeqlensQ, mO, mLSE, mOPartial,
            mLSEPartial, mKScale, mVScale, softmax_scale_log2, num_splits, sQ_layout, sKV_layout, sStage_layout,
            mma_qk, mma_pv, make_row_copy(self.dtype, d, CONSUMER_THREADS),
            *make_dequant_copies(self.kv_dtype, self.dtype, d, CONSUMER_THREADS), SharedStorage,
        ).launch(
            grid=[num_splits, mKCache.shape[2], mContextLens.shape[0]],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        tma_k: cute.CopyAtom,
        gK_all: cute.Tensor,
        tma_v: cute.CopyAtom,
        gV_all: cute.Tensor,
        mBlockTables: cute.Tensor,
        mContextLens: cute.Tensor,
        mCuSeqlensQ: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mOPartial: cute.Tensor,
        mLSEPartial: cute.Tensor,
        mKScale: cute.Tensor,
        mVScale: cute.Tensor,
        softmax_scale_log2: Float32,
        num_splits: Int32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        sStage_layout: cute.ComposedLayout,
        mma_qk: cute.TiledMma,
        mma_pv: cute.TiledMma,
        q_copy: cute.TiledCopy,
        load_copy: cute.TiledCopy,
        store_copy: cute.TiledCopy,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        split, kv_head, batch_idx = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        context_len = mContextLens[batch_idx]
        q_start = mCuSeqlensQ[batch_idx]
        q_len = mCuSeqlensQ[batch_idx + 1] - q_start
        group = mQ.shape[1] // gK_all.shape[2]
        tile_lo, n_local = sched.split_tiles(split, num_splits, context_len, cutlass.min)  # this split's key tiles

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sKc = storage.sKc.get_tensor(sStage_layout.outer, swizzle=sStage_layout.inner)
        sVc = storage.sVc.get_tensor(sStage_layout.outer, swizzle=sStage_layout.inner)
        tile_bytes = sched.stage_tx_bytes(self.head_dim, self.kv_dtype.width // 8)
        kv_pipeline = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CONSUMER_THREADS // 32),
            tx_count=tile_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )

        if warp_idx == PRODUCER_WARP:
            self.produce(tma_k, gK_all, _as_blocks(sK), tma_v, gV_all, _as_blocks(sV), kv_pipeline,
                         mBlockTables, batch_idx, kv_head, context_len, tile_lo, n_local)
        else:
            ctx = _DecodeContext(q_start, q_len, context_len, group, kv_head, split, num_splits)
            scale_log2, out_scale = softmax_scale_log2, Float32(1.0)
            if cutlass.const_expr(self.fp8):  # per-head scales: CTA-wide scalars (see decode_dequant.py)
                scale_log2, out_scale = softmax_scale_log2 * mKScale[kv_head], mVScale[kv_head]
            self.consume(mQ, sQ, sK, sV, sKc, sVc, q_copy, load_copy, store_copy, mma_qk, mma_pv, kv_pipeline,
                         mO, mLSE, mOPartial, mLSEPartial, scale_log2, out_scale, tile_lo, n_local, ctx)

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def produce(self, tma_k, gK_all, sKb, tma_v, gV_all, sVb, kv_pipeline, mBlockTables,
                batch_idx: Int32, kv_head: Int32, context_len: Int32, tile_lo: Int32, n_local: Int32):
        cpasync.prefetch_descriptor(tma_k)
        cpasync.prefetch_descriptor(tma_v)
        # (TMA, block-slot in the ring) destinations, (TMA, cache block) sources of this KV head.
        tKsK, tKgK = cpasync.tma_partition(tma_k, 0, cute.make_layout(1), cute.group_modes(sKb, 0, 2),
                                           cute.group_modes(gK_all[None, None, kv_head, None], 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_v, 0, cute.make_layout(1), cute.group_modes(sVb, 0, 2),
                                           cute.group_modes(gV_all[None, None, kv_head, None], 0, 2))
        lane = cute.arch.lane_idx()
        last_col = sched.last_table_column(context_len)  # columns past it repeat it (masked later)
        entries = self._table_entry(mBlockTables, batch_idx, tile_lo, 0, lane, last_col)
        next_entries = self._table_entry(mBlockTables, batch_idx, tile_lo, 1, lane, last_col)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        for i in cutlass.range(n_local, unroll=1):
            kv_pipeline.producer_acquire(state)
            barrier = kv_pipeline.producer_get_barrier(state)
            for j in cutlass.range_constexpr(BLOCKS_PER_TILE):
                block = cute.arch.shuffle_sync(entries, sched.block_lane(i, j))
                slot = state.index * BLOCKS_PER_TILE + j
                cute.copy(tma_k, tKgK[None, block], tKsK[None, slot], tma_bar_ptr=barrier)
                cute.copy(tma_v, tVgV[None, block], tVsV[None, slot], tma_bar_ptr=barrier)
            kv_pipeline.producer_commit(state)
            state.advance()
            if sched.refills_table_group(i):  # next group's entries, read a group ago
                entries = next_entries
                next_entries = self._table_entry(mBlockTables, batch_idx, tile_lo, sched.next_table_group(i), lane,
                                                 last_col)

    @cute.jit
    def _table_entry(self, mBlockTables, batch_idx: Int32, tile_lo: Int32, group_index: Int32, lane: Int32,
                     last_col: Int32) -> Int32:
        return mBlockTables[batch_idx, sched.table_column(tile_lo, group_index, lane, last_col, cutlass.min)]

    # ------------------------------------------------------------------ consumer warpgroup
    @cute.jit
    def consume(self, mQ, sQ, sK, sV, sKc, sVc, q_copy, load_copy, store_copy, mma_qk, mma_pv, kv_pipeline, mO,
                mLSE, mOPartial, mLSEPartial, softmax_scale_log2: Float32, out_scale: Float32, tile_lo: Int32,
                n_local: Int32, ctx):
        tidx, _, _ = cute.arch.thread_idx()
        self.load_q(mQ, sQ, q_copy.get_slice(tidx), q_copy, ctx)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        # cp.async writes are generic-proxy; wgmma reads shared memory through the async proxy.
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)

        # The wgmmas read the ring itself, or (an e4m3 cache) the one dequantized tile.
        sKm, sVm = (sKc, sVc) if cutlass.const_expr(self.fp8) else (sK, sV)
        # V^T view [d, keys, stage] for the PV B operand (same bytes, MN-major).
        sVt = cute.composition(
            sVm, cute.make_ordered_layout((self.head_dim, KEYS_PER_TILE, cute.size(sVm, mode=[2])), order=(1, 0, 2))
        )
        thr_mma_qk = mma_qk.get_slice(tidx)
        thr_mma_pv = mma_pv.get_slice(tidx)
        tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
        tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sKm))
        tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((QUERY_ROWS, self.head_dim)), Float32)
        acc_O.fill(0.0)
        row_max = cute.make_rmem_tensor((cute.size(acc_as_rows_cols(acc_O), mode=[0]),), Float32)
        row_sum = cute.make_rmem_tensor_like(row_max)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        tScS_rc = acc_as_rows_cols(thr_mma_qk.partition_C(cute.make_identity_tensor((QUERY_ROWS, KEYS_PER_TILE))))
        # Keys at or past mask_from are hidden from some query row (its later tokens, the cache's tail).
        mask_from = sched.mask_from(ctx.context_len, ctx.q_len)

        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        for i in cutlass.range(n_local, unroll=1):
            tile = tile_lo + i
            kv_pipeline.consumer_wait(state)
            mma_stage = state.index
            if cutlass.const_expr(self.fp8):
                self.dequant_stage(sK, sV, sKc, sVc, state.index, load_copy, store_copy, tidx)
                kv_pipeline.consumer_release(state)  # the ring slot is free once converted
                mma_stage = 0
            acc_S = cute.make_rmem_tensor(thr_mma_qk.partition_shape_C((QUERY_ROWS, KEYS_PER_TILE)), Float32)
            wgmma(mma_qk, acc_S, tSrQ, tSrK[None, None, None, mma_stage], zero_init=True)
            if sched.tile_needs_mask(tile, mask_from):
                self.apply_mask(acc_S, tScS_rc, tile, ctx)
                self.zero_v_tail(sVm, mma_stage, sched.tile_valid_keys(tile, ctx.context_len), tidx)
            online_softmax(acc_S, acc_O, row_max, row_sum, softmax_scale_log2)
            tOrP = cute.make_rmem_tensor_like(acc_as_operand_a(acc_S), self.dtype)
            tOrP.store(acc_as_operand_a(acc_S).load().to(self.dtype))
            wgmma(mma_pv, acc_O, tOrP, tOrVt[None, None, None, mma_stage], zero_init=False)
            if cutlass.const_expr(not self.fp8):
                kv_pipeline.consumer_release(state)
            state.advance()

        self.epilogue(mO, mLSE, mOPartial, mLSEPartial, acc_O, row_max, row_sum, thr_mma_pv, ctx,
                      softmax_scale_log2, out_scale)

    @cute.jit
    def dequant_stage(self, sK, sV, sKc, sVc, stage: Int32, load_copy, store_copy, tidx: Int32):
        """e4m3 K and V of ring stage `stage` -> the 16-bit tiles sKc, sVc. The first barrier keeps the
        previous tile's wgmmas (every warp waited for its own) ahead of the overwrite; the fence and
        the second order these generic-proxy stores before the wgmmas read them (async proxy)."""
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)
        dequant_tile(load_copy, store_copy, sK[None, None, stage], sKc[None, None, 0], tidx, self.dtype)
        dequant_tile(load_copy, store_copy, sV[None, None, stage], sVc[None, None, 0], tidx, self.dtype)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)

    @cute.jit
    def load_q(self, mQ, sQ, thr_copy, q_copy, ctx):
        """cp.async the packed Q rows; padding rows repeat the last token (finite, never stored)."""
        tQsQ = thr_copy.partition_D(sQ)
        tQcQ = thr_copy.partition_S(cute.make_identity_tensor((QUERY_ROWS, self.head_dim)))
        for i in cutlass.range_constexpr(cute.size(tQsQ, mode=[1])):
            coord = tQcQ[0, i, 0]
            token = sched.padding_token(coord[0] // ctx.group, ctx.q_len, cutlass.min)
            head = sched.packed_row(coord[0], ctx.kv_head, ctx.group)[1]
            offset = (Int64(ctx.q_start + token) * Int64(mQ.stride[0]) + Int64(head) * Int64(mQ.stride[1])
                      + Int64(coord[1]))
            copy_row_chunk(q_copy, self.dtype, mQ, offset, tQsQ[None, i, 0])

    @cute.jit
    def apply_mask(self, acc_S, tScS_rc, tile: Int32, ctx):
        """-inf for keys past each row's last visible position: context_len - q_len + token."""
        s = acc_as_rows_cols(acc_S)
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            token = sched.padding_token(tScS_rc[r, 0][0] // ctx.group, ctx.q_len, cutlass.min)
            col_limit = sched.key_limit(token, tile, ctx.context_len, ctx.q_len)
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                if tScS_rc[0, c][1] >= col_limit:
                    s[r, c] = -Float32.inf

    @cute.jit
    def zero_v_tail(self, sV, stage: Int32, valid_keys: Int32, tidx: Int32):
        """Zero V rows valid_keys.. of this stage (slots past the context), then order those writes
        before the PV wgmma reads them through the async proxy."""
        if valid_keys < KEYS_PER_TILE:
            for row in cutlass.range(cutlass.max(valid_keys, 0), KEYS_PER_TILE, unroll=1):
                for c in cutlass.range_constexpr((self.head_dim + CONSUMER_THREADS - 1) // CONSUMER_THREADS):
                    col = c * CONSUMER_THREADS + tidx
                    if col < self.head_dim:
                        sV[row, col, stage] = self.dtype(0.0)
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=CONSUMER_BARRIER, number_of_threads=CONSUMER_THREADS)

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def epilogue(self, mO, mLSE, mOPartial, mLSEPartial, acc_O, row_max, row_sum, thr_mma_pv, ctx,
                 softmax_scale_log2: Float32, out_scale: Float32):
        """O * out_scale / row sum and the LSE of each real row: final (dtype) with one split, else this
        split's fp32 partial. An empty split (or rows whose keys are all masked) writes O = 0, LSE = -inf.
        out_scale is the V scale of an e4m3 cache (1 otherwise): P (V_stored * s) = s (P V_stored)."""
        o = acc_as_rows_cols(acc_O)
        tOcO = acc_as_rows_cols(thr_mma_pv.partition_C(cute.make_identity_tensor((QUERY_ROWS, self.head_dim))))
        lane = cute.arch.lane_idx()
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            total = quad_allreduce_sum(row_sum[r])
            inv = out_scale / total if total > 0.0 else Float32(0.0)
            token, head = sched.packed_row(tOcO[r, 0][0], ctx.kv_head, ctx.group)
            if token < ctx.q_len:
                q_row = ctx.q_start + token
                lse = row_lse(row_max[r], total, softmax_scale_log2)
                if ctx.num_splits == 1:
                    out = cute.make_rmem_tensor_like(o[r, None], self.dtype)
                    out.store((o[r, None].load() * inv).to(self.dtype))
                    for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                        mO[q_row, head, tOcO[0, c][1]] = out[c]
                    if lane % 4 == 0:
                        mLSE[q_row, head] = lse
                else:
                    for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                        mOPartial[ctx.split, q_row, head, tOcO[0, c][1]] = o[r, c] * inv
                    if lane % 4 == 0:
                        mLSEPartial[ctx.split, q_row, head] = lse


@cute.jit
def _as_blocks(sX: cute.Tensor) -> cute.Tensor:
    """(key, d, stage) ring -> (slot, d, (block, stage)): the TMA destination of each cache block."""
    blocks = cute.flat_divide(sX, (KV_BLOCK_SIZE, sX.shape[1]))  # (16, d, 4, 1, stages)
    return cute.group_modes(blocks, 2, 5)


class _DecodeContext:
    """Per-CTA runtime scalars passed between the consumer's helpers."""

    def __init__(self, q_start, q_len, context_len, group, kv_head, split, num_splits):
        self.q_start, self.q_len, self.context_len = q_start, q_len, context_len
        self.group, self.kv_head, self.split, self.num_splits = group, kv_head, split, num_splits
