"""--deterministic for the linears: a row's output bits depend on that row alone, not on how many rows
share the call (README, Deterministic inference).

Block-quantized weights: the GEMV and the tiles GEMM sum each block exactly in integers and add the
scaled block sums in one order (cute_kernels/cpu/csrc/quant_dot.h), so both routes give a row the same
bits; only the dequantize + fp32 GEMM route (K-quants and the portable build, from DEQUANT_MIN_ROWS rows)
sums otherwise, and is not taken. Float weights: oneDNN picks its kernel by row count, and rows of a
1-row and of a 2-row product differ in their last bits; with the row count fixed (FIXED_ROWS, the last
slice padded with zeros) a row gets the same bits wherever it sits in the call. FP8 weights on Hopper:
the CuTe GEMM without split-K. (Dense bf16 linears on a GPU, cuBLAS, are left as they are.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.accel.block_linear import BlockQuantLinear, BlockQuantParts
from runtime.accel.cpu_linear import PackedCpuLinear, packed_linear
from runtime.model.linear import DenseLinear, Linear

FIXED_ROWS = 8  # rows per float product: oneDNN's packed kernel at 8 rows costs about what it does at 1


class FixedRowsLinear:
    """A float CPU linear run FIXED_ROWS rows at a time."""

    def __init__(self, inner: DenseLinear) -> None:
        self.inner = inner
        self.packed = inner.packed if isinstance(inner, PackedCpuLinear) else None

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_linear(x, self.packed, self.inner.bias)
        return F.linear(x, self.inner.weight, self.inner.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        m = rows.shape[0]
        padded = -(-m // FIXED_ROWS) * FIXED_ROWS
        if padded != m:
            rows = torch.cat([rows, rows.new_zeros(padded - m, rows.shape[1])])
        out = torch.cat([self._product(rows[i:i + FIXED_ROWS]) for i in range(0, padded, FIXED_ROWS)])
        return out[:m].reshape(*x.shape[:-1], -1)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()


def batch_invariant(linear: Linear) -> Linear:
    """linear, made to give each row the same bits at any row count where it would not."""
    parts = linear.parts if isinstance(linear, BlockQuantParts) else [linear]
    for part in parts:
        if isinstance(part, BlockQuantLinear):
            part.allow_dequant = False
    if hasattr(linear, "k_splits"):  # the CuTe FP8 GEMM: no split-K (its tile order is fixed)
        linear.k_splits = 1
    if isinstance(linear, DenseLinear) and linear.weight.device.type == "cpu":
        return FixedRowsLinear(linear)
    return linear
