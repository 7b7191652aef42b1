"""The prefill kernel's producer warpgroup: every global -> shared load, issued ahead of the MMA
warpgroups into mbarrier-guarded stages (prefill_attention.py owns the roles and the barriers).

- Key/value tiles made only of new keys go by TMA: the first producer warp, all 32 lanes, issues one
  bulk tensor copy (the DSL's TMA copy elects its own lane, warp-collectively: issued from one lane,
  inside `if ptid == 0`, that election waits for 31 lanes that never come and the kernel hangs), after
  one elected lane has armed the stage's full barrier with the tile's byte count (rows past the
  tensor's end are zeros, rows of the next sequence are finite; both are masked to -inf in S, so P
  is exactly 0 there).
- Q comes by TMA too, the same way: one (head_dim, group, tokens) box of packed rows (prefill_tma.py);
  rows past the sequence's end are the next sequence's (or zeros past the tensor): finite, never stored.
- Tiles that touch the paged prefix (16-token blocks, too small for 128-row TMA boxes) are
  gathered with cp.async by all 128 producer threads, which then wait for
  their own copies (an e4m3 prefix: its 8-byte chunks land in a raw staging tile, and each thread
  converts its own into the stage: stored * scale, to the 16-bit dtype; a thread reads back only what
  it copied itself, so no barrier), fence them to the async proxy (wgmma reads shared memory through
  it), meet at a producer-only named barrier and let one thread arrive on the full barrier.
Empty barriers: every MMA thread arrives once it is done reading a stage.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cute.nvgpu import cpasync

from ..common.warpgroup_ops import copy_row_chunk
from .prefill_schedule import key_row_coords, ring_slot
from .prefill_spec import KV_BLOCK_SIZE

PRODUCER_BARRIER_ID = 1  # named barrier of the producer warpgroup; 0 is the CTA-wide one
RAW_CHUNK = 8  # e4m3 values per chunk: one row chunk of the 16-bit stage (16 bytes) is 8 bytes of cache


class PrefillLoads:
    """Producer-side methods of PrefillAttentionSm90 (a mixin: self carries the compile-time config)."""

    @cute.jit
    def produce(self, q_tma, k_src, v_src, mBlockTables, bars, row_copy, ptid: Int32, pwarp: Int32, ctx,
                n_block_max: Int32, kv_count: Int32, tiles_done: Int32):
        """One tile: Q (q_tma: (atom, smem, gmem) of its TMA load) once the previous tile's consumers
        are done with sQ, then K[n] and V[n] for n = n_block_max-1 down to 0, in the consumers' order,
        into ring positions kv_count, kv_count + 1, ... (the key tiles of earlier tiles came before).
        pwarp: the thread's producer warp (warp-uniform): warp 0 issues every TMA load."""
        thr_copy = row_copy.get_slice(ptid)
        if pwarp == 0:
            cute.arch.mbarrier_wait(bars.q_empty, (tiles_done % 2) ^ 1)
            self.tma_load(q_tma[0], q_tma[2], q_tma[1], bars.q_full, self.q_tile_bytes)
        for i in cutlass.range(n_block_max, unroll=1):
            n_block = n_block_max - 1 - i
            stage, phase = ring_slot(kv_count + i, self.stages)
            cute.arch.mbarrier_wait(bars.k_empty + stage, phase ^ 1)
            self.load_kv_tile(k_src, mBlockTables, bars.k_full + stage, thr_copy, row_copy, ptid, pwarp, ctx,
                              n_block, stage)
            cute.arch.mbarrier_wait(bars.v_empty + stage, phase ^ 1)
            self.load_kv_tile(v_src, mBlockTables, bars.v_full + stage, thr_copy, row_copy, ptid, pwarp, ctx,
                              n_block, stage)

    @cute.jit
    def tma_load(self, atom, gmem, smem, full_bar, tx_bytes: int):
        """Called by a whole warp: one lane arms the full barrier with the bytes to come (its one
        arrival), then the warp issues the copy, whose own election picks the lane that sends it."""
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(full_bar, tx_bytes)
        cute.copy(atom, gmem, smem, tma_bar_ptr=full_bar)

    @cute.jit
    def load_kv_tile(self, src, mBlockTables, full_bar, thr_copy, row_copy, ptid: Int32, pwarp: Int32, ctx,
                     n_block: Int32, stage: Int32):
        if n_block * self.tile_n >= ctx.prefix_len:  # new keys only: one TMA box
            if pwarp == 0:
                self.tma_load(src.tma_atom, src.tma_gmem[None, n_block], src.tma_smem[None, stage], full_bar,
                              self.kv_tile_bytes)
        else:
            self.gather_kv(src, mBlockTables, src.smem[None, None, stage], thr_copy, row_copy, ctx, n_block)
            if cutlass.const_expr(self.fp8):
                cute.arch.cp_async_commit_group()
                cute.arch.cp_async_wait_group(0)  # this thread's raw chunks are in: convert them
                self.dequant_prefix(src, src.smem[None, None, stage], thr_copy, ctx, n_block)
            self._commit_cp_async(full_bar, ptid)

    @cute.jit
    def _commit_cp_async(self, full_bar, ptid: Int32):
        """Wait for this thread's cp.async copies and make them visible to wgmma (async proxy); once
        every producer thread has (named barrier), thread 0 gives the full barrier its one arrival."""
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=PRODUCER_BARRIER_ID, number_of_threads=self.producer_threads)
        if ptid == 0:
            cute.arch.mbarrier_arrive(full_bar)

    @cute.jit
    def gather_kv(self, src, mBlockTables, sX, thr_copy, row_copy, ctx, n_block: Int32):
        """cp.async key tile n_block of K or V: prefix rows from the paged cache (an e4m3 one into the
        raw staging tile), the rest from the packed new rows; rows past seqlen_k are clamped to the
        last key (masked later)."""
        mX, mXCache = src.rows, src.cache
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
                if cutlass.const_expr(self.fp8):
                    _copy_raw_chunk(mXCache, offset, _raw_chunk(src.raw, coord))
                else:
                    copy_row_chunk(row_copy, self.dtype, mXCache, offset, tXsX[None, i, 0])
            else:
                offset = (Int64(new_row) * Int64(mX.stride[0]) + Int64(ctx.kv_head) * Int64(mX.stride[1])
                          + col)
                copy_row_chunk(row_copy, self.dtype, mX, offset, tXsX[None, i, 0])

    @cute.jit
    def dequant_prefix(self, src, sX, thr_copy, ctx, n_block: Int32):
        """This thread's prefix chunks of the tile (gather_kv's, in its order): raw e4m3 * scale -> sX."""
        tXsX = thr_copy.partition_D(sX)
        tXcX = thr_copy.partition_S(cute.make_identity_tensor((self.tile_n, self.head_dim)))
        for i in cutlass.range_constexpr(cute.size(tXsX, mode=[1])):
            coord = tXcX[0, i, 0]
            key_pos = cutlass.min(n_block * self.tile_n + coord[0], ctx.seqlen_k - 1)
            if key_pos < ctx.prefix_len:
                raw = cute.make_rmem_tensor((RAW_CHUNK,), cutlass.Float8E4M3FN)
                cute.autovec_copy(_raw_chunk(src.raw, coord), raw)
                wide = cute.make_rmem_tensor((RAW_CHUNK,), self.dtype)
                wide.store((raw.load().to(Float32) * src.scale).to(self.dtype))
                cute.autovec_copy(wide, tXsX[None, i, 0])


@cute.jit
def _raw_chunk(sRaw: cute.Tensor, coord) -> cute.Tensor:
    """The raw staging tile's 8 bytes at (row, col) of the key tile (col a multiple of 8)."""
    return cute.zipped_divide(sRaw, (1, RAW_CHUNK))[None, (coord[0], coord[1] // RAW_CHUNK)]


@cute.jit
def _copy_raw_chunk(mCache: cute.Tensor, elem_offset, dst: cute.Tensor):
    """One 8-byte cp.async of e4m3 cache bytes from element (= byte) `elem_offset` (Int64) into dst."""
    ptr = cute.make_ptr(cutlass.Float8E4M3FN, mCache.iterator.toint() + elem_offset, cute.AddressSpace.gmem,
                        assumed_align=8)
    atom = cute.make_copy_atom(cpasync.CopyG2SOp(), cutlass.Float8E4M3FN, num_bits_per_copy=64)
    cute.copy(atom, cute.make_tensor(ptr, dst.layout), dst)


class KeySource:
    """Where the producer reads K (or V) from for one CTA: the packed new rows and the paged cache
    (cp.async gathers), and the TMA view of the new rows of this KV head, tiled so that tile n holds
    key positions n * tile_n ... (its rows start at k_start - prefix_len + n * tile_n)."""

    def __init__(self, rows, cache, smem, tma_atom, mX_tma, kv_head, row_offset, tile_n: int, head_dim: int):
        self.rows, self.cache, self.smem, self.tma_atom = rows, cache, smem, tma_atom
        self.scale, self.raw = None, None  # an e4m3 prefix: its KV head's scale and the raw staging tile
        head = mX_tma[None, None, kv_head]
        tiles = cute.local_tile(cute.domain_offset((row_offset, 0), head), (tile_n, head_dim), (None, 0))
        # ((atom, rest), STAGE) and ((atom, rest), N): one TMA copy per stage / key tile
        self.tma_smem, self.tma_gmem = cute.nvgpu.cpasync.tma_partition(
            tma_atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(tiles, 0, 2))

    def dequant(self, scale: Float32, raw: cute.Tensor) -> None:
        self.scale, self.raw = scale, raw
