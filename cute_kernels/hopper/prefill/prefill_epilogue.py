"""The prefill kernel's epilogue: O / row sum and the LSE of each packed row, then O to global memory.

A full tile (every token of it inside the sequence) leaves through shared memory: once the previous
tile's store has read sO, the MMA warpgroups write their rows with stmatrix, fence them to the async
proxy, meet at a named barrier (the producer is not part of it) and one thread issues a single TMA
store of the (head_dim, group, tokens) box (prefill_tma.py); it completes while the next tile runs,
and the CTA waits for it before exiting (drain_stores).
The ragged last tile of a sequence cannot use the box (its rows past the end belong to the next
sequence), so its threads store their valid rows directly. The LSE is stored per row either way.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.tensor_utils import LayoutEnum

from ..common.warpgroup_ops import quad_allreduce_sum, row_lse
from ..common.wgmma_layouts import acc_as_rows_cols

EPILOGUE_BARRIER_ID = 5  # after the producer's (1) and the MMA warpgroups' turn barriers (2-4)


class PrefillEpilogue:
    """Epilogue methods of PrefillAttentionSm90 (a mixin: self carries the compile-time config)."""

    @cute.jit
    def epilogue(self, out, acc_O, row_max, row_sum, mma_pv, ctid: Int32, ctx, softmax_scale_log2: Float32):
        """out: (mO, mLSE, sO, (TMA store atom, its shared and global operands))."""
        mO, mLSE, sO, o_tma = out
        o = acc_as_rows_cols(acc_O)
        tOcO = acc_as_rows_cols(mma_pv.get_slice(ctid).partition_C(
            cute.make_identity_tensor((self.tile_m, self.head_dim))))
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            total = quad_allreduce_sum(row_sum[r])
            o[r, None].store(o[r, None].load() * (1.0 / total if total > 0.0 else Float32(0.0)))
            row = tOcO[r, 0][0]
            token = ctx.m_block * self.tile_tokens + row // self.group
            if row < self.tile_rows and token < ctx.q_len and cute.arch.lane_idx() % 4 == 0:
                mLSE[ctx.q_start + token, ctx.kv_head * self.group + row % self.group] = row_lse(
                    row_max[r], total, softmax_scale_log2)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        if (ctx.m_block + 1) * self.tile_tokens <= ctx.q_len:
            self.store_tile_tma(rO, sO, o_tma, mma_pv, ctid)
        else:
            self.store_rows(mO, acc_as_rows_cols(rO), tOcO, ctx)

    @cute.jit
    def store_tile_tma(self, rO, sO, o_tma, mma_pv, ctid: Int32):
        r2s_atom = sm90_utils.sm90_get_smem_store_op(LayoutEnum.ROW_MAJOR, elem_ty_d=self.dtype,
                                                      elem_ty_acc=Float32)
        stmatrix = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), self.dtype)
        r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(stmatrix, mma_pv))
        thr_r2s = r2s.get_slice(ctid)
        if ctid == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous tile's store has read sO
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER_ID, number_of_threads=self.mma_threads)
        tRS_sO = thr_r2s.partition_D(sO)
        # retile(rO) keeps all of a thread's values in one mode; the copy wants (values, M, N) like its
        # shared side: the registers are already in that order (16 columns per stmatrix.x4)
        tRS_rO = cute.make_tensor(r2s.retile(rO).iterator, cute.make_layout(thr_r2s.partition_S(sO).shape))
        cute.copy(r2s, tRS_rO, tRS_sO)
        cute.arch.fence_proxy("async.shared", space="cta")  # the generic-proxy writes, visible to TMA
        cute.arch.barrier(barrier_id=EPILOGUE_BARRIER_ID, number_of_threads=self.mma_threads)
        if ctid == 0:
            cute.copy(o_tma[0], o_tma[1], o_tma[2])
            cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def drain_stores(self, ctid: Int32):
        """Shared memory must outlive the last TMA store's reads of it."""
        if ctid == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_unseeing_tile(self, mO, mLSE, mma_pv, ctid: Int32, ctx):
        """A tile whose queries see no key (loads_key_tiles: nothing was loaded for it): O = 0 and
        LSE = -inf, stored per thread. The host refuses such input; this keeps the kernel from waiting
        for stages no one fills if it is fed one anyway."""
        thr_mma = mma_pv.get_slice(ctid)
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        acc_O.fill(0.0)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        tOcO = acc_as_rows_cols(thr_mma.partition_C(cute.make_identity_tensor((self.tile_m, self.head_dim))))
        for r in cutlass.range_constexpr(cute.size(tOcO, mode=[0])):
            row = tOcO[r, 0][0]
            token = ctx.m_block * self.tile_tokens + row // self.group
            if row < self.tile_rows and token < ctx.q_len and cute.arch.lane_idx() % 4 == 0:
                mLSE[ctx.q_start + token, ctx.kv_head * self.group + row % self.group] = -Float32.inf
        self.store_rows(mO, acc_as_rows_cols(rO), tOcO, ctx)

    @cute.jit
    def store_rows(self, mO, o, tOcO, ctx):
        """Per-thread stores of this thread's valid rows of the ragged tile."""
        for r in cutlass.range_constexpr(cute.size(o, mode=[0])):
            row = tOcO[r, 0][0]
            token = ctx.m_block * self.tile_tokens + row // self.group
            if row < self.tile_rows and token < ctx.q_len:
                head = ctx.kv_head * self.group + row % self.group
                for c in cutlass.range_constexpr(cute.size(o, mode=[1])):
                    mO[ctx.q_start + token, head, tOcO[0, c][1]] = o[r, c]
