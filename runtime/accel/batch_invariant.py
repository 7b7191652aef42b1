"""--deterministic for the linears: a row's output bits depend on that row alone, not on how many rows
share the call (README, Deterministic inference).

Block-quantized weights: the GEMV and the tiles GEMM sum each block exactly in integers and add the
scaled block sums in one order (cute_kernels/cpu/csrc/quant_dot.h), so both routes give a row the same
bits; only the dequantize + fp32 GEMM route (K-quants and the portable build, from DEQUANT_MIN_ROWS rows)
and the AMX tiles (prefill rows from AMX_MIN_ROWS on CPUs with them) round otherwise, and are not taken. Float weights: oneDNN's packed product gives a row the same bits at
every row count from 2 on (measured to 1100 rows, any position; test_cpu_linear.py holds it), but takes
another kernel for 1 row, and F.linear (MKL) changes kernels at several row counts: so every product
runs packed, a single row padded to 2. Without oneDNN, F.linear at a fixed FIXED_ROWS rows per call.
FP8 weights on Hopper: the CuTe GEMM without split-K. (Dense bf16 linears on a GPU, cuBLAS, are left
as they are.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.accel.block_linear import BlockQuantLinear, BlockQuantParts
from runtime.accel.cpu_linear import PackedCpuLinear, packed_linear
from runtime.model.linear import DenseLinear, Linear

FIXED_ROWS = 8  # rows per F.linear call where no packed weight is at hand


def _padded(rows: torch.Tensor, multiple: int) -> torch.Tensor:
    short = -rows.shape[0] % multiple
    return rows if not short else torch.cat([rows, rows.new_zeros(short, rows.shape[1])])


class InvariantFloatLinear:
    """A float CPU linear whose kernel does not change with the row count."""

    def __init__(self, inner: DenseLinear) -> None:
        self.inner = inner
        self.packed = inner.packed if isinstance(inner, PackedCpuLinear) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        m = rows.shape[0]
        if self.packed is not None:
            out = packed_linear(_padded(rows, 2) if m < 2 else rows, self.packed, self.inner.bias)
        else:
            rows = _padded(rows, FIXED_ROWS)
            out = torch.cat([F.linear(rows[i:i + FIXED_ROWS], self.inner.weight, self.inner.bias)
                             for i in range(0, rows.shape[0], FIXED_ROWS)])
        return out[:m].reshape(*x.shape[:-1], -1)

    def weight_bytes(self) -> int:
        return self.inner.weight_bytes()


def batch_invariant(linear: Linear) -> Linear:
    """linear, made to give each row the same bits at any row count where it would not."""
    parts = linear.parts if isinstance(linear, BlockQuantParts) else [linear]
    for part in parts:
        if isinstance(part, BlockQuantLinear):
            part.allow_dequant = False
    if hasattr(linear, "invariant"):  # bf16 weights: no switch to the packed GEMM by row count
        linear.invariant = True
    if hasattr(linear, "k_splits"):  # the CuTe FP8 GEMM: no split-K (its tile order is fixed)
        linear.k_splits = 1
    if isinstance(linear, DenseLinear) and linear.weight.device.type == "cpu":
        return InvariantFloatLinear(linear)
    return linear
