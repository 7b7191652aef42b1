"""FlashAttention-3-style varlen prefill attention for Hopper (sm_90a), in the CuTe DSL.

Contract: the same as reference.prefill_attention_ref (packed [tokens, heads, d] q/k/v,
cu_seqlens, paged prefix through 16-token block tables, bottom-right causal, GQA by head ratio),
plus an fp32 LSE [total_q, heads] output.

Design (a tile = tile_m packed query rows of one KV head of one sequence against 128-key tiles:
128 rows and 2 MMA warpgroups at d 128, 192 rows and 3 at d 64; plus one producer warpgroup):
- Persistent: one CTA per SM walks a longest-first list of tiles (prefill_tile_order.py; entries
  cta, cta + grid, ...); producer and MMA warpgroups walk it alike and agree without a barrier; the
  K/V ring positions and the Q buffer's phase carry from tile to tile (Q empty barrier: the next
  tile's Q loads once the MMA warpgroups are done with the last one).
- Packed GQA: rows are (token, query head of this KV head), so each K/V tile is loaded once per group.
- Warp specialization: warpgroup 0 is the producer (registers lowered by setmaxnreg), issuing every
  load into a Q buffer and `stages`-deep K and V rings on mbarriers (prefill_loads.py): Q and key
  tiles of new keys by TMA (Q as one (head_dim, group, tokens) box: prefill_tma.py), tiles touching
  the paged prefix by cp.async gathers. The MMA warpgroups
  (registers raised) own 64 query rows each (prefill_mma.py). No CTA-wide barrier after the barrier
  setup: stages are handed over by full/empty mbarriers only.
- S = Q K^T with SS wgmma, O += P V with RS wgmma (P stays in registers), fp32 accumulation; online
  softmax in fp32 with exp2; the mask is one select per element against a per-row limit.
- Epilogue (prefill_epilogue.py): O through shared memory and one TMA store per full tile; the
  ragged last tile of a sequence stores per thread (a box would overwrite the next sequence's rows).
- An e4m3 paged prefix (spec.fp8_kv): the producer gathers its rows' bytes with cp.async into a raw
  staging tile, then converts its own chunks (stored * the KV head's scale, rounded to the 16-bit
  dtype) into the stage the wgmmas read; new keys and the math are the 16-bit kernel's.
- Key tiles are visited from the last to the first so only the first few (diagonal / ragged) tiles
  pay for masking, and tiles beyond the causal frontier are never loaded.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync

from ..common.warpgroup_ops import DTYPES, attention_tiled_mmas, make_row_copy, swizzled_rows_layout
from .prefill_epilogue import PrefillEpilogue
from .prefill_loads import KeySource, PrefillLoads
from .prefill_mma import PrefillMma
from .prefill_schedule import kv_block_range, loads_key_tiles, tile_coords, tile_has_rows, tile_tokens
from .prefill_spec import PrefillSpec
from .prefill_tma import packed_rows_partition, packed_rows_smem_layout, packed_rows_tma


class PrefillAttentionSm90(PrefillLoads, PrefillMma, PrefillEpilogue):
    """Compile-time configuration + host launch (__call__) + kernel body (roles and barriers)."""

    def __init__(self, spec: PrefillSpec):
        self.spec = spec
        self.dtype = DTYPES[spec.dtype]
        self.fp8 = spec.fp8_kv
        self.head_dim = spec.head_dim
        self.group = spec.qheads_per_kvhead
        self.causal = spec.causal
        tile = spec.tile
        self.tile_m, self.tile_n, self.stages = tile.tile_m, tile.tile_n, tile.stages
        self.num_wg = tile.num_mma_warpgroups
        assert self.tile_m == 64 * self.num_wg
        self.tile_tokens = tile_tokens(self.tile_m, self.group)
        self.tile_rows = self.tile_tokens * self.group  # packed rows of whole tokens (the rest: padding)
        self.producer_threads = 128
        self.mma_threads = 128 * self.num_wg
        self.num_threads = self.producer_threads + self.mma_threads
        self.producer_regs, self.mma_regs = tile.producer_registers, tile.mma_registers
        self.kv_tile_bytes = self.tile_n * self.head_dim * self.dtype.width // 8
        self.q_tile_bytes = self.tile_rows * self.head_dim * self.dtype.width // 8

    # ------------------------------------------------------------------ configuration
    def _smem_layout(self, rows: int, stages: int | None = None):
        """Row-major [rows, head_dim(, stage)] tile with the widest GMMA swizzle (K-major for Q and K)."""
        shape = (rows, self.head_dim) if stages is None else (rows, self.head_dim, stages)
        return swizzled_rows_layout(self.dtype, self.head_dim, shape)

    def _tma_atom(self, mX: cute.Tensor, s_layout, rows: int):
        """TMA load of one [rows, d] tile of one head from packed [tokens, heads, d] rows."""
        tokens_d_heads = cute.make_tensor(mX.iterator, cute.select(mX.layout, mode=[0, 2, 1]))
        info = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), tokens_d_heads, cute.select(s_layout, mode=[0, 1]),
            (rows, self.head_dim),
        )
        return info.atom, info.tma_tensor

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
        mTileOrder: cute.Tensor,  # [tiles] int32 linear tile ids, longest first (prefill_tile_order.py)
        mKScale: cute.Tensor,  # [Hkv] fp32: an e4m3 prefix's K = stored * scale (read by _kv_e4m3 variants only)
        mVScale: cute.Tensor,  # [Hkv] fp32
        softmax_scale_log2: Float32,
        max_seqlen_q: Int32,
        num_ctas: Int32,  # persistent grid: one CTA per SM, at most one per tile
        stream: cuda.CUstream,
    ):
        mma_qk, mma_pv = attention_tiled_mmas(self.dtype, self.head_dim, self.tile_n, self.num_wg)
        sQ_layout = self._smem_layout(self.tile_m)
        sKV_layout = self._smem_layout(self.tile_n, self.stages)
        tma_k, mK_tma = self._tma_atom(mK, sKV_layout, self.tile_n)
        tma_v, mV_tma = self._tma_atom(mV, sKV_layout, self.tile_n)
        num_kv_heads = mK.shape[1]
        tma_q, mQ_tma = packed_rows_tma(cpasync.CopyBulkTensorTileG2SOp(), mQ, sQ_layout, self.group,
                                        self.tile_tokens, num_kv_heads)
        tma_o, mO_tma = packed_rows_tma(cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout, self.group,
                                        self.tile_tokens, num_kv_heads)

        @cute.struct
        class SharedStorage:
            q_full: cute.struct.MemRange[cutlass.Int64, 1]
            q_empty: cute.struct.MemRange[cutlass.Int64, 1]
            k_full: cute.struct.MemRange[cutlass.Int64, self.stages]
            k_empty: cute.struct.MemRange[cutlass.Int64, self.stages]
            v_full: cute.struct.MemRange[cutlass.Int64, self.stages]
            v_empty: cute.struct.MemRange[cutlass.Int64, self.stages]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            # an e4m3 prefix's raw bytes of one key tile, on their way to a stage (a token 16 B otherwise)
            sRaw: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, self._raw_elems()], 128]

        num_m_blocks = (max_seqlen_q + self.tile_tokens - 1) // self.tile_tokens
        self.kernel(
            mQ, mK, mV, mKCache, mVCache, mBlockTables, mPrefixLens, mCuSeqlensQ, mCuSeqlensK, mO, mLSE, mTileOrder,
            mKScale, mVScale, mK_tma, mV_tma, tma_k, tma_v, mQ_tma, tma_q, mO_tma, tma_o, softmax_scale_log2, num_m_blocks,
            sQ_layout, sKV_layout, mma_qk, mma_pv, make_row_copy(self.dtype, self.head_dim, self.producer_threads),
            SharedStorage,
        ).launch(
            grid=[num_ctas, 1, 1],
            block=[self.num_threads, 1, 1],
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
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
        mTileOrder: cute.Tensor,
        mKScale: cute.Tensor,
        mVScale: cute.Tensor,
        mK_tma: cute.Tensor,
        mV_tma: cute.Tensor,
        tma_k: cute.CopyAtom,
        tma_v: cute.CopyAtom,
        mQ_tma: cute.Tensor,
        tma_q: cute.CopyAtom,
        mO_tma: cute.Tensor,
        tma_o: cute.CopyAtom,
        softmax_scale_log2: Float32,
        num_m_blocks: Int32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        mma_qk: cute.TiledMma,
        mma_pv: cute.TiledMma,
        row_copy: cute.TiledCopy,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        cta, _, _ = cute.arch.block_idx()
        num_ctas, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sO = storage.sO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sRaw = storage.sRaw.get_tensor(cute.make_layout(self._raw_shape(), stride=(self.head_dim, 1)))
        box = packed_rows_smem_layout(sQ_layout, self.group, self.tile_tokens)  # TMA's view of sQ and sO
        bars = _Barriers(storage)
        if warp_idx == 0:
            for atom in (tma_k, tma_v, tma_q, tma_o):
                cpasync.prefetch_descriptor(atom)
        if tidx == 0:
            _init_barriers(bars, self.stages, self.mma_threads)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()  # the barriers exist before anyone waits on them (not in a loop)

        # Persistent: every role walks the same tiles (cta, cta + num_ctas, ... of the longest-first
        # list), so they agree without a barrier; K/V ring positions and the Q phase carry across tiles.
        meta = (mTileOrder, num_m_blocks, mK.shape[1], mCuSeqlensQ, mCuSeqlensK, mPrefixLens)
        kv_count, tiles_done = Int32(0), Int32(0)
        if warp_idx < self.producer_threads // 32:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            sQ_box = storage.sQ.get_tensor(box.outer, swizzle=box.inner)
            for idx in cutlass.range(cta, mTileOrder.shape[0], num_ctas, unroll=1):
                kv_count, tiles_done = self.produce_tile(
                    idx, meta, kv_count, tiles_done, mK, mV, mKCache, mVCache, mBlockTables, sK, sV, sQ_box,
                    mK_tma, mV_tma, mQ_tma, tma_k, tma_v, tma_q, bars, row_copy, tidx, warp_idx,
                    (mKScale, mVScale, sRaw))
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            mma_wg = warp_idx // 4 - 1
            ctid = tidx - self.producer_threads
            sO_box = storage.sO.get_tensor(box.outer, swizzle=box.inner)
            self.start_ping_pong(mma_wg)
            for idx in cutlass.range(cta, mTileOrder.shape[0], num_ctas, unroll=1):
                kv_count, tiles_done = self.consume_tile(
                    idx, meta, kv_count, tiles_done, mO, mLSE, mO_tma, tma_o, sQ, sK, sV, sO, sO_box, bars,
                    mma_qk, mma_pv, ctid, mma_wg, softmax_scale_log2)
            self.drain_stores(ctid)

    @cute.jit
    def produce_tile(self, idx: Int32, meta, kv_count: Int32, tiles_done: Int32, mK, mV, mKCache, mVCache,
                     mBlockTables, sK, sV, sQ_box, mK_tma, mV_tma, mQ_tma, tma_k, tma_v, tma_q, bars, row_copy,
                     ptid: Int32, pwarp: Int32, fp8_prefix):
        """The producer's part of list entry idx (ptid: its thread, pwarp: its warp, warp-uniform); returns
        the advanced (ring position, tiles done). fp8_prefix: (K scales, V scales, raw staging tile)."""
        ctx = _tile_context(idx, *meta)
        if tile_has_rows(ctx.m_block, self.tile_tokens, ctx.q_len):  # tiles past a sequence's end: no work
            n_block_max, _ = self.key_tiles(ctx)
            if loads_key_tiles(n_block_max):
                row_offset = ctx.k_start - ctx.prefix_len
                k_src = KeySource(mK, mKCache, sK, tma_k, mK_tma, ctx.kv_head, row_offset, self.tile_n,
                                  self.head_dim)
                v_src = KeySource(mV, mVCache, sV, tma_v, mV_tma, ctx.kv_head, row_offset, self.tile_n,
                                  self.head_dim)
                if cutlass.const_expr(self.fp8):
                    k_src.dequant(fp8_prefix[0][ctx.kv_head], fp8_prefix[2])
                    v_src.dequant(fp8_prefix[1][ctx.kv_head], fp8_prefix[2])
                q_tma = (tma_q,) + tuple(packed_rows_partition(tma_q, mQ_tma, sQ_box, self.group, self.tile_tokens,
                                                               ctx.kv_head, ctx.q_start, ctx.m_block))
                self.produce(q_tma, k_src, v_src, mBlockTables, bars, row_copy, ptid, pwarp, ctx, n_block_max,
                             kv_count, tiles_done)
                kv_count += n_block_max
                tiles_done += 1
        return kv_count, tiles_done

    @cute.jit
    def consume_tile(self, idx: Int32, meta, kv_count: Int32, tiles_done: Int32, mO, mLSE, mO_tma, tma_o, sQ, sK,
                     sV, sO, sO_box, bars, mma_qk, mma_pv, ctid: Int32, mma_wg: Int32, softmax_scale_log2: Float32):
        """The MMA warpgroups' part of list entry idx; returns the advanced (ring position, tiles done)."""
        ctx = _tile_context(idx, *meta)
        if tile_has_rows(ctx.m_block, self.tile_tokens, ctx.q_len):
            n_block_max, n_mask_start = self.key_tiles(ctx)
            if loads_key_tiles(n_block_max):
                o_tma = (tma_o,) + tuple(packed_rows_partition(tma_o, mO_tma, sO_box, self.group, self.tile_tokens,
                                                               ctx.kv_head, ctx.q_start, ctx.m_block))
                self.consume((mO, mLSE, sO, o_tma), sQ, sK, sV, bars, mma_qk, mma_pv, ctid, mma_wg, ctx,
                             n_block_max, cutlass.max(n_mask_start, 0), softmax_scale_log2, kv_count, tiles_done)
                kv_count += n_block_max
                tiles_done += 1
            else:
                self.store_unseeing_tile(mO, mLSE, mma_pv, ctid, ctx)
        return kv_count, tiles_done

    @cute.jit
    def key_tiles(self, ctx):
        """(n_block_max, n_mask_start) of the tile: prefill_schedule.kv_block_range."""
        return kv_block_range(ctx.m_block, ctx.q_len, ctx.seqlen_k, self.group, self.tile_rows, self.tile_n,
                              self.causal, imin=cutlass.min, imax=cutlass.max)


    def _raw_shape(self) -> tuple[int, int]:
        return (self.tile_n, self.head_dim) if self.fp8 else (1, 16)

    def _raw_elems(self) -> int:
        rows, cols = self._raw_shape()
        return rows * cols


class _Barriers:
    """The CTA's mbarriers: Q full (1 arrival + TMA bytes) and empty (every MMA thread, once per tile);
    per stage K/V full (1 arrival + TMA bytes) and empty (every MMA thread)."""

    def __init__(self, storage):
        self.q_full, self.q_empty = storage.q_full.data_ptr(), storage.q_empty.data_ptr()
        self.k_full, self.k_empty = storage.k_full.data_ptr(), storage.k_empty.data_ptr()
        self.v_full, self.v_empty = storage.v_full.data_ptr(), storage.v_empty.data_ptr()



def _init_barriers(bars: _Barriers, stages: int, consumers: int):
    cute.arch.mbarrier_init(bars.q_full, 1)
    cute.arch.mbarrier_init(bars.q_empty, consumers)
    for s in range(stages):
        cute.arch.mbarrier_init(bars.k_full + s, 1)
        cute.arch.mbarrier_init(bars.v_full + s, 1)
        cute.arch.mbarrier_init(bars.k_empty + s, consumers)
        cute.arch.mbarrier_init(bars.v_empty + s, consumers)


@cute.jit
def _tile_context(idx: Int32, mTileOrder, num_m_blocks: Int32, kv_heads: Int32, cu_q, cu_k, prefix_lens):
    """The runtime scalars of list entry idx (prefill_schedule.tile_coords names the tile)."""
    # warp-uniform: the per-tile scalars may live in uniform registers (the producer has 32 per thread)
    tile_id = cute.arch.make_warp_uniform(mTileOrder[idx])
    m_block, kv_head, batch_idx = tile_coords(tile_id, num_m_blocks, kv_heads)
    q_start, k_start, prefix_len = cu_q[batch_idx], cu_k[batch_idx], prefix_lens[batch_idx]
    seqlen_k = prefix_len + cu_k[batch_idx + 1] - k_start
    return _TileContext(q_start, cu_q[batch_idx + 1] - q_start, k_start, prefix_len, seqlen_k, kv_head, m_block,
                        batch_idx)


class _TileContext:
    """Per-tile runtime scalars passed between the kernel's helpers."""

    def __init__(self, q_start, q_len, k_start, prefix_len, seqlen_k, kv_head, m_block, batch_idx):
        self.q_start, self.q_len, self.k_start = q_start, q_len, k_start
        self.prefix_len, self.seqlen_k = prefix_len, seqlen_k
        self.kv_head, self.m_block, self.batch_idx = kv_head, m_block, batch_idx
