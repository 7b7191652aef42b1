"""Write a step's new K/V into the paged cache for Hopper (sm_90a), in the CuTe DSL: reference.write_kv.

Operands (fused_common's signature): mA k and mB v [tokens, kv_heads * d] (any token stride: views of
the fused qkv), mC k_cache and mD v_cache as [slots, kv_heads * d] (slot = block * 16 + offset; pools
past 2^31 elements are fine: row offsets are 64-bit), mSlots int64 [tokens]. A slot of -1 is skipped
(a padded row that must not touch the cache); so is one past the cache, where the reference raises:
a kernel must not write outside its pool. One CTA per token; raw 128-bit copies, no conversion.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .fused_common import FusedKernelSm90, row_vectors
from .fused_spec import VEC


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
