"""What the fused elementwise kernels share: one signature (so one AOT ABI serves the family), a
row-per-CTA launch, and 128-bit vector loads and stores of 8 16-bit (or 8 fp32: two vectors) values.

Signature of every fused kernel: five 2-D tensors mA..mE ([rows, cols], unit column stride, runtime
row stride), an int64 vector mSlots and one fp32 scalar. Each op documents which it reads and writes;
the others are placeholders it never touches.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .fused_spec import VEC, FusedOpSpec

DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


def row_vectors(matrix: cute.Tensor, row) -> cute.Tensor:
    """Row `row` of a [rows, cols] tensor as ((VEC), (cols / VEC)): index [None, i] is vector i."""
    return cute.zipped_divide(matrix[row, None], (VEC,))


def load_f32(vectors: cute.Tensor, i, dtype):
    """Vector i as fp32 values (one 128-bit load for 16-bit data)."""
    frag = cute.make_rmem_tensor((VEC,), dtype)
    cute.autovec_copy(vectors[None, i], frag)
    return frag.load().to(Float32)


def store_as(vectors: cute.Tensor, i, values, dtype) -> None:
    """Round fp32 `values` to dtype and store them as vector i (one 128-bit store)."""
    frag = cute.make_rmem_tensor((VEC,), dtype)
    frag.store(values.to(dtype))
    cute.autovec_copy(frag, vectors[None, i])


class FusedKernelSm90:
    """Host side shared by the fused kernels: grid [rows of mA, grid_y], `threads` per CTA."""

    threads = 128

    def __init__(self, spec: FusedOpSpec):
        self.spec = spec
        self.dtype = DTYPES[spec.dtype]

    def grid_y(self, mA: cute.Tensor, mE: cute.Tensor):
        return 1

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor, mE: cute.Tensor,
                 mSlots: cute.Tensor, scalar: Float32, stream: cuda.CUstream):
        self.kernel(mA, mB, mC, mD, mE, mSlots, scalar).launch(
            grid=[mA.shape[0], self.grid_y(mA, mE), 1], block=[self.threads, 1, 1], stream=stream)
