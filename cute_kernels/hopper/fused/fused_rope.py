"""Rotary embedding for Hopper (sm_90a), in the CuTe DSL: reference.rope_ref, rotating x in place.

Operands (fused_common's signature): mA x [tokens, heads * d] (the heads of one token contiguous, any
token stride: q and k rotate together as a view of the fused qkv), mB cos and mC sin [tokens, d / 2]
fp32 (rows of the fp32 tables: bf16 angles lose precision at long positions). Rotate-half layout:
head vector [x1, x2] becomes [x1 cos - x2 sin, x2 cos + x1 sin]. One CTA per token; each thread takes
one 8-wide chunk of x1 and the matching chunk of x2 (two 128-bit loads) and of cos/sin (four).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .fused_common import FusedKernelSm90, load_f32, row_vectors, store_as
from .fused_spec import VEC


class RopeSm90(FusedKernelSm90):
    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
               mSlots: cute.Tensor, scalar: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        half_vectors = self.spec.size // 2 // VEC  # vectors in one half of a head
        x, cos, sin = row_vectors(mA, token), row_vectors(mB, token), row_vectors(mC, token)
        pairs = mA.shape[1] // (2 * VEC)  # (head, chunk of x1) pairs of this token
        for p in cutlass.range(tidx, pairs, self.threads):
            j = p % half_vectors
            first = (p // half_vectors) * (2 * half_vectors) + j
            a, b = load_f32(x, first, self.dtype), load_f32(x, first + half_vectors, self.dtype)
            c, s = load_f32(cos, j, Float32), load_f32(sin, j, Float32)
            store_as(x, first, a * c - b * s, self.dtype)
            store_as(x, first + half_vectors, b * c + a * s, self.dtype)
