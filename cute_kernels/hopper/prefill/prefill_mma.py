"""The prefill kernel's MMA warpgroups: S = Q K^T, mask, online softmax, O += P V over the key tiles
the producer streams into mbarrier-guarded stages, then the epilogue (prefill_epilogue.py).

The warpgroups split the tile's query rows (64 each: 2 at d 128, 3 at d 64) and share every K/V
stage; each thread arrives on a stage's empty barrier once its wgmma reads of that stage completed.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import warpgroup

from ..common.warpgroup_ops import rescale_rows, softmax_update, wgmma_issue
from ..common.wgmma_layouts import acc_as_operand_a, acc_as_rows_cols
from .prefill_schedule import query_key_position, ring_slot

SCHEDULER_BARRIER_ID = 2  # named barriers 2, 3(, 4): each MMA warpgroup's turn at the tensor cores
PAIR = 256  # threads meeting at a scheduler barrier: the waiting warpgroup and the one handing over


@cute.jit
def wait_all_below_branch(always_true: cutlass.Boolean):
    """wgmma wait_group(0) that ptxas cannot schedule above the code before it. Within a basic block
    ptxas hoists the wait over the softmax (no register of the in-flight GEMM is touched: it is
    scheduling, not a hazard), so the exp2 stall on the PV GEMM instead of overlapping it; a branch
    on an (always true) runtime condition ends the block. The condition must be warp-uniform (the
    wait is .sync.aligned); the unconditional wait after the join keeps it correct whatever its value."""
    if always_true:
        warpgroup.wait_group(0)
    warpgroup.wait_group(0)


class PrefillMma:
    """Consumer-side methods of PrefillAttentionSm90 (a mixin: self carries the compile-time config).

    Within a warpgroup, S[n+1] = Q K[n+1]^T is issued before O += P[n] V[n] and only the QK GEMM is
    waited for (wait_group(1)), so the softmax of tile n+1 runs while the PV GEMM of tile n does; O
    is rescaled and P rewritten only after the PV wait (see wait_all_below_branch). Between the
    warpgroups, named barriers pass the turn to issue GEMMs round-robin (ping-pong with two): one
    warpgroup issues while the others run their softmax.
    """

    @cute.jit
    def start_ping_pong(self, wg: Int32):
        """The first warpgroup issues first (once per kernel: each tile hands the turn on as many times as
        it takes it, so the turn is back at warpgroup 0 when the next tile starts)."""
        if wg == 0:
            cute.arch.barrier_arrive(barrier_id=SCHEDULER_BARRIER_ID, number_of_threads=PAIR)

    @cute.jit
    def consume(self, out, sQ, sK, sV, bars, mma_qk, mma_pv, ctid: Int32, wg: Int32, ctx,
                n_block_max: Int32, n_mask_start: Int32, softmax_scale_log2: Float32, kv_count: Int32,
                tiles_done: Int32):
        """One tile; its key tiles sit at ring positions kv_count, kv_count + 1, ..."""
        thr_mma_qk = mma_qk.get_slice(ctid)
        thr_mma_pv = mma_pv.get_slice(ctid)
        # V^T view [d, keys, stage] for the PV B operand (same bytes, MN-major).
        sVt = cute.composition(sV, cute.make_ordered_layout((self.head_dim, self.tile_n, self.stages), order=(1, 0, 2)))
        tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ))
        tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK))
        tOrVt = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sVt))
        acc_O = cute.make_rmem_tensor(thr_mma_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32)
        acc_O.fill(0.0)
        row_max = cute.make_rmem_tensor((cute.size(acc_as_rows_cols(acc_O), mode=[0]),), Float32)
        row_sum = cute.make_rmem_tensor_like(row_max)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        # (row, column) of each S element this thread holds, and thread 0's (compile-time) columns
        identity = cute.make_identity_tensor((self.tile_m, self.tile_n))
        tScS_rc = acc_as_rows_cols(thr_mma_qk.partition_C(identity))
        t0ScS_rc = acc_as_rows_cols(mma_qk.get_slice(0).partition_C(identity))
        shape_S = thr_mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        tOrP = cute.make_rmem_tensor_like(acc_as_operand_a(cute.make_rmem_tensor(shape_S, Float32)), self.dtype)

        common = (bars, mma_qk, mma_pv, tSrQ, tSrK, tOrVt, tOrP, acc_O, row_max, row_sum, tScS_rc, t0ScS_rc,
                  shape_S, ctx, softmax_scale_log2, kv_count)
        cute.arch.mbarrier_wait(bars.q_full, tiles_done % 2)
        # Key tiles n_block_max-1 down to 0: the first always masked (it may be the ragged end),
        # then the rest of the masked ones (diagonal), then the fully visible ones.
        n_masked = n_block_max - cutlass.min(n_mask_start, n_block_max)
        self.first_tile(n_block_max - 1, *common)
        for i in cutlass.range(1, n_masked, unroll=1):
            self.overlapped_step(i, n_block_max - 1 - i, True, wg, *common)
        for i in cutlass.range(cutlass.max(n_masked, 1), n_block_max, unroll=1):
            self.overlapped_step(i, n_block_max - 1 - i, False, wg, *common)
        last, last_phase = ring_slot(kv_count + n_block_max - 1, self.stages)
        cute.arch.mbarrier_wait(bars.v_full + last, last_phase)
        wgmma_issue(mma_pv, acc_O, tOrP, tOrVt[None, None, None, last], zero_init=False)
        warpgroup.wait_group(0)
        cute.arch.mbarrier_arrive(bars.v_empty + last)
        cute.arch.mbarrier_arrive(bars.q_empty)  # every QK GEMM of this tile is done: sQ may be refilled
        self.epilogue(out, acc_O, row_max, row_sum, mma_pv, ctid, ctx, softmax_scale_log2)

    @cute.jit
    def first_tile(self, n_block: Int32, bars, mma_qk, mma_pv, tSrQ, tSrK, tOrVt, tOrP, acc_O, row_max, row_sum,
                   tScS_rc, t0ScS_rc, shape_S, ctx, softmax_scale_log2: Float32, kv_count: Int32):
        """S[0] and its softmax into P; its PV GEMM is issued by the next step (or the tail)."""
        stage, phase = ring_slot(kv_count, self.stages)
        cute.arch.mbarrier_wait(bars.k_full + stage, phase)
        acc_S = cute.make_rmem_tensor(shape_S, Float32)
        wgmma_issue(mma_qk, acc_S, tSrQ, tSrK[None, None, None, stage], zero_init=True)
        warpgroup.wait_group(0)
        cute.arch.mbarrier_arrive(bars.k_empty + stage)
        self.apply_mask(acc_S, tScS_rc, t0ScS_rc, n_block, ctx)
        softmax_update(acc_S, row_max, row_sum, softmax_scale_log2)
        tOrP.store(acc_as_operand_a(acc_S).load().to(self.dtype))

    @cute.jit
    def overlapped_step(self, i: Int32, n_block: Int32, masked: cutlass.Constexpr, wg: Int32, bars, mma_qk, mma_pv,
                        tSrQ, tSrK, tOrVt, tOrP, acc_O, row_max, row_sum, tScS_rc, t0ScS_rc, shape_S, ctx,
                        softmax_scale_log2: Float32, kv_count: Int32):
        """Issue S[i] = Q K[i]^T and O += P[i-1] V[i-1]; softmax S[i] while the PV GEMM runs."""
        pos = kv_count + i  # ring position
        stage, phase = ring_slot(pos, self.stages)
        prev = pos - 1
        prev_stage, prev_phase = ring_slot(prev, self.stages)
        cute.arch.mbarrier_wait(bars.k_full + stage, phase)
        cute.arch.barrier(barrier_id=SCHEDULER_BARRIER_ID + wg, number_of_threads=PAIR)
        acc_S = cute.make_rmem_tensor(shape_S, Float32)
        wgmma_issue(mma_qk, acc_S, tSrQ, tSrK[None, None, None, stage], zero_init=True)
        cute.arch.mbarrier_wait(bars.v_full + prev_stage, prev_phase)
        wgmma_issue(mma_pv, acc_O, tOrP, tOrVt[None, None, None, prev_stage], zero_init=False)
        cute.arch.barrier_arrive(barrier_id=SCHEDULER_BARRIER_ID + (wg + 1) % self.num_wg, number_of_threads=PAIR)
        warpgroup.wait_group(1)  # S[i] is ready; the PV GEMM may still run
        cute.arch.mbarrier_arrive(bars.k_empty + stage)
        if const_expr(masked):
            self.apply_mask(acc_S, tScS_rc, t0ScS_rc, n_block, ctx)
        correction = softmax_update(acc_S, row_max, row_sum, softmax_scale_log2)
        wait_all_below_branch(pos >= 0)  # P[i-1] V[i-1] is in acc_O; tOrP may be overwritten
        cute.arch.mbarrier_arrive(bars.v_empty + prev_stage)
        rescale_rows(acc_O, correction)
        tOrP.store(acc_as_operand_a(acc_S).load().to(self.dtype))

    @cute.jit
    def apply_mask(self, acc_S, tScS_rc, t0ScS_rc, n_block: Int32, ctx):
        """-inf for keys past seqlen_k and, if causal, past each row's key position: one select per
        element against a per-row limit. Columns are compared as thread 0's (compile-time constants)
        against limits shifted by this thread's column offset, so no column index is computed."""
        s = acc_as_rows_cols(acc_S)
        col_offset = n_block * self.tile_n + tScS_rc[0, 0][1]
        seqlen_limit = ctx.seqlen_k - col_offset
        for r in cutlass.range_constexpr(cute.size(s, mode=[0])):
            col_limit = seqlen_limit
            if const_expr(self.causal):
                token = ctx.m_block * self.tile_tokens + tScS_rc[r, 0][0] // self.group
                col_limit = cutlass.min(query_key_position(token, ctx.q_len, ctx.seqlen_k) + 1 - col_offset,
                                        seqlen_limit)
            for c in cutlass.range_constexpr(cute.size(s, mode=[1])):
                s[r, c] = -Float32.inf if t0ScS_rc[0, c][1] >= col_limit else s[r, c]
