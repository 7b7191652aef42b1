"""Register-layout views of Hopper wgmma accumulators (fp32, 16-bit inputs).

A thread's accumulator fragment of an m64nN wgmma tiled over MMA_M x MMA_N has shape
((2, 2, N/8), MMA_M, MMA_N): (column pair, row +0/+8, 8-column group). These views reinterpret the
same registers without moving data.
"""
from __future__ import annotations

import cutlass.cute as cute


def _rows_cols_layout(acc_layout: cute.Layout) -> cute.Layout:
    # ((2, 2, V), M, N) -> ((2, M), (2, V, N)): mode 0 walks this thread's rows, mode 1 its columns.
    flat = cute.make_layout(acc_layout.shape)
    shape, stride = flat.shape, flat.stride
    rows_cols = cute.make_layout(
        ((shape[0][1], shape[1]), (shape[0][0], shape[0][2], shape[2])),
        stride=((stride[0][1], stride[1]), (stride[0][0], stride[0][2], stride[2])),
    )
    return cute.composition(acc_layout, rows_cols)


def acc_as_rows_cols(acc: cute.Tensor) -> cute.Tensor:
    """View an accumulator (or its identity-coordinate partition) as [my rows, my columns]."""
    return cute.make_tensor(acc.iterator, _rows_cols_layout(acc.layout))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """View the S accumulator as the register A operand of the next wgmma (k = 16 per instruction).

    Two adjacent 8-column groups of S make one 16-wide K slice of P:
    ((2, 2, V), M, N) -> ((2, 2, 2), M, (V/2, N)).
    """
    layout = acc.layout
    assert layout.shape[0][2] % 2 == 0, "S tile width must be a multiple of 16"
    split = cute.logical_divide(layout, ((None, None, 2), None, None))
    shape, stride = split.shape, split.stride
    operand = cute.make_layout(
        ((shape[0][0], shape[0][1], shape[0][2][0]), shape[1], (shape[0][2][1], shape[2])),
        stride=((stride[0][0], stride[0][1], stride[0][2][0]), stride[1], (stride[0][2][1], stride[2])),
    )
    return cute.make_tensor(acc.iterator, operand)
