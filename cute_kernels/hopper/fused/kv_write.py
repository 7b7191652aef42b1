"""Write a step's new K/V into the paged cache for Hopper (sm_90a), in the CuTe DSL: reference.write_kv.

Operands (fused_common's signature): mA k and mB v [tokens, kv_heads * d] (any token stride: views of
the fused qkv), mC k_cache and mD v_cache as [slots, kv_heads * d] (slot = block * 16 + offset; pools
past 2^31 elements are fine: row offsets are 64-bit), mSlots int64 [tokens]. A slot of -1 is skipped
(a padded row that must not touch the cache); so is one past the cache, where the reference raises:
a kernel must not write outside its pool. One CTA per token; raw 128-bit copies, no conversion
(KvWriteE4m3Sm90: the quantizing write into an e4m3 cache).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .fused_common import FusedKernelSm90, row_vectors
from .fused_spec import FP8_VEC, VEC


class KvWriteSm90(FusedKernelSm90):
    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
               mSlots: cute.Tensor, scalar: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        slot = mSlots[token]
        if slot >= 0 and slot < mC.shape[0]:
            k, v = row_vectors(mA, token), row_vectors(mB, token)
            k_dst, v_dst = row_vectors(mC, slot), row_vectors(mD, slot)
            frag = cute.make_rmem_tensor((VEC,), self.dtype)
            for c in cutlass.range(tidx, mA.shape[1] // VEC, self.threads):
                cute.autovec_copy(k[None, c], frag)
                cute.autovec_copy(frag, k_dst[None, c])
                cute.autovec_copy(v[None, c], frag)
                cute.autovec_copy(frag, v_dst[None, c])


class KvWriteE4m3Sm90(FusedKernelSm90):
    """The same write into float8_e4m3fn caches, quantizing: stored = x / scale of its KV head,
    saturated to +-448 (NaN stays NaN), as cute_kernels.kv_e4m3.write_kv_e4m3_ref. mE is fp32 [2, kv_heads]: the
    K scales, then the V scales; spec.size is head_dim. Each thread takes 16 values of one head (two
    128-bit loads of K and of V, one 128-bit store of each)."""

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
               mSlots: cute.Tensor, scalar: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        slot = mSlots[token]
        if slot >= 0 and slot < mC.shape[0]:
            k, v = _fp8_vectors(mA, token), _fp8_vectors(mB, token)
            k_dst, v_dst = _fp8_vectors(mC, slot), _fp8_vectors(mD, slot)
            for c in cutlass.range(tidx, mA.shape[1] // FP8_VEC, self.threads):
                head = c * FP8_VEC // self.spec.size
                self._quantize(k[None, c], mE[0, head], k_dst[None, c])
                self._quantize(v[None, c], mE[1, head], v_dst[None, c])

    @cute.jit
    def _quantize(self, src: cute.Tensor, scale: Float32, dst: cute.Tensor):
        """16 values of src (two 128-bit loads) / scale, saturated, as 16 e4m3 bytes into dst (one store)."""
        x = cute.make_rmem_tensor((FP8_VEC,), self.dtype)
        cute.autovec_copy(src, x)
        q = cute.make_rmem_tensor((FP8_VEC,), cutlass.Float8E4M3FN)
        # IEEE division (div.rn) as torch's; the conversion is cvt.rn.satfinite: saturates to +-448
        q.store((x.load().to(Float32) / scale).to(cutlass.Float8E4M3FN))
        cute.autovec_copy(q, dst)


def _fp8_vectors(matrix: cute.Tensor, row) -> cute.Tensor:
    """Row `row` as ((16), (cols / 16)): index [None, i] is the 16 values of one e4m3 vector."""
    return cute.zipped_divide(matrix[row, None], (FP8_VEC,))
