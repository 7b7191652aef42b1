"""SiLU-and-mul for Hopper (sm_90a), in the CuTe DSL: reference.silu_and_mul_ref.

Operands (fused_common's signature): mA gate_up [rows, 2 * I] (gate half first), mE out [rows, I].
Grid [rows, I / 8 / 128]: each thread reads one 8-wide vector of the gate and the matching one of the
up half and writes one; silu(g) * u in fp32, rounded once.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

from .fused_common import FusedKernelSm90, load_f32, row_vectors, store_as
from .fused_spec import VEC


class SiluAndMulSm90(FusedKernelSm90):
    def grid_y(self, mA: cute.Tensor, mE: cute.Tensor):
        return (mE.shape[1] // VEC + self.threads - 1) // self.threads

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
               mSlots: cute.Tensor, scalar: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        row, by, _ = cute.arch.block_idx()
        inter_vectors = mE.shape[1] // VEC
        c = by * self.threads + tidx
        if c < inter_vectors:
            gate_up = row_vectors(mA, row)
            g = load_f32(gate_up, c, self.dtype)
            u = load_f32(gate_up, c + inter_vectors, self.dtype)
            store_as(row_vectors(mE, row), c, g / (1.0 + cute.math.exp(-g, fastmath=True)) * u, self.dtype)
