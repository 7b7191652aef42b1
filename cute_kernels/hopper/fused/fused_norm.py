"""Fused residual add + RMSNorm for Hopper (sm_90a), in the CuTe DSL: reference.add_rms_norm_ref.

Operands (fused_common's signature): mA x [rows, W], mB residual [rows, W] (read when the spec has
one), mC weight [1, W], mD new residual x + residual [rows, W] (written when the spec has one; without
a residual it is x itself and the host returns x), mE normed output [rows, W]; scalar: eps.
One CTA per row (256 threads, 512 for the widest class); the row stays in registers between the sum of squares and the
scaling, so x and the residual are read once. The sum x + residual is rounded to the storage dtype
before it is squared, as the reference (which adds in that dtype) does.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from .fused_common import FusedKernelSm90, load_f32, row_vectors, store_as
from .fused_spec import VEC, norm_threads, norm_vectors_per_thread


class AddRmsNormSm90(FusedKernelSm90):
    def __init__(self, spec):
        super().__init__(spec)
        self.threads = norm_threads(spec.size)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
               mSlots: cute.Tensor, eps: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        width = mA.shape[1]
        chunks = norm_vectors_per_thread(self.spec.size)
        x, weight, out = row_vectors(mA, row), row_vectors(mC, 0), row_vectors(mE, row)
        kept = cute.make_rmem_tensor((VEC, chunks), Float32)
        sum_sq = Float32(0.0)
        for i in cutlass.range_constexpr(chunks):
            c = i * self.threads + tidx
            if c * VEC < width:
                v = load_f32(x, c, self.dtype)
                if const_expr(self.spec.residual):
                    v = (v + load_f32(row_vectors(mB, row), c, self.dtype)).to(self.dtype).to(Float32)
                    store_as(row_vectors(mD, row), c, v, self.dtype)
                kept[None, i].store(v)
                for j in cutlass.range_constexpr(VEC):
                    sum_sq += kept[j, i] * kept[j, i]
        total = self._block_sum(sum_sq, tidx)
        inv_rms = cute.math.rsqrt(total / width.to(Float32) + eps)
        for i in cutlass.range_constexpr(chunks):
            c = i * self.threads + tidx
            if c * VEC < width:
                store_as(out, c, kept[None, i].load() * inv_rms * load_f32(weight, c, self.dtype), self.dtype)

    @cute.jit
    def _block_sum(self, value: Float32, tidx) -> Float32:
        """Sum over the CTA: butterfly within each warp, then every thread adds the warps' partials."""
        warps = self.threads // 32
        for k in cutlass.range_constexpr(5):
            value = value + cute.arch.shuffle_sync_bfly(value, offset=1 << k)
        partials = cutlass.memory.SmemAllocator().allocate_tensor(Float32, cute.make_layout(warps))
        if tidx % 32 == 0:
            partials[tidx // 32] = value
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps):
            total += partials[w]
        return total
