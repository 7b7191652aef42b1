"""Merge of split-KV decode partials (flash-decoding's reduction), in the CuTe DSL.

Each split s of a query row's keys left O_s (normalized over its own keys, fp32) and LSE_s (natural
log, -inf for a split with no visible key). The row's result is O = sum_s exp(LSE_s - LSE) O_s with
LSE = log sum_s exp(LSE_s). One warp per (query row, head): lane s reads LSE_s (at most 32 splits),
the weights are reduced across the warp, and each lane accumulates d / 32 columns, so every partial
is read once, coalesced. A few KiB per sequence: its cost is the launch, which CUDA graphs amortize.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..common.warpgroup_ops import DTYPES
from . import decode_schedule as sched
from .decode_spec import MAX_SPLITS, DecodeMergeSpec

WARPS_PER_CTA = 4


class DecodeMergeSm90:
    """Compile-time configuration + host launch (__call__) + kernel body."""

    def __init__(self, spec: DecodeMergeSpec):
        self.spec = spec
        self.dtype = DTYPES[spec.dtype]
        self.head_dim = spec.head_dim
        assert MAX_SPLITS <= 32

    @cute.jit
    def __call__(
        self,
        mOPartial: cute.Tensor,  # [splits, total_q, H, d] fp32
        mLSEPartial: cute.Tensor,  # [splits, total_q, H] fp32
        mO: cute.Tensor,  # [total_q, H, d]
        mLSE: cute.Tensor,  # [total_q, H] fp32
        stream: cuda.CUstream,
    ):
        rows = mO.shape[0] * mO.shape[1]
        self.kernel(mOPartial, mLSEPartial, mO, mLSE).launch(
            grid=[(rows + WARPS_PER_CTA - 1) // WARPS_PER_CTA, 1, 1],
            block=[32 * WARPS_PER_CTA, 1, 1],
            stream=stream,
        )

    @cute.kernel
    def kernel(self, mOPartial: cute.Tensor, mLSEPartial: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        heads = mO.shape[1]
        pair = bidx * WARPS_PER_CTA + tidx // 32
        if pair < mO.shape[0] * heads:
            row, head = sched.merge_pair(pair, heads)
            splits = mLSEPartial.shape[0]
            lse_s = -Float32.inf
            if lane < splits:
                lse_s = mLSEPartial[lane, row, head]
            top = _warp_allreduce(lse_s, cutlass.max)
            weight = Float32(0.0)
            if lse_s > -Float32.inf:
                weight = sched.split_weight(lse_s, top, _exp2)
            total = _warp_allreduce(weight, lambda a, b: a + b)
            inv = 1.0 / total if total > 0.0 else Float32(0.0)
            cols = self.head_dim // 32
            acc = cute.make_rmem_tensor((cols,), Float32)
            acc.fill(0.0)
            for s in cutlass.range(splits, unroll=1):
                w = cute.arch.shuffle_sync(weight, s) * inv
                if w > 0.0:  # skip empty splits: their partials may be anything
                    for c in cutlass.range_constexpr(cols):
                        acc[c] = acc[c] + w * mOPartial[s, row, head, c * 32 + lane]
            for c in cutlass.range_constexpr(cols):
                mO[row, head, c * 32 + lane] = self.dtype(acc[c])
            if lane == 0:
                lse = -Float32.inf
                if total > 0.0:
                    lse = sched.merged_lse(top, total, _log2)
                mLSE[row, head] = lse


def _exp2(x: Float32) -> Float32:
    return cute.math.exp2(x, fastmath=True)


def _log2(x: Float32) -> Float32:
    return cute.math.log2(x, fastmath=True)


@cute.jit
def _warp_allreduce(x: Float32, op: cutlass.Constexpr) -> Float32:
    for i in cutlass.range_constexpr(5):
        x = op(x, cute.arch.shuffle_sync_bfly(x, offset=16 >> i))
    return x
