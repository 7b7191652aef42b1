"""8-row groups: ggml's Q4_0, Q4_1 and Q8_0 blocks laid out for the GEMV (types Q4_0_R8, Q4_1_R8, Q8_0_R8).

Why: in the file's layout a row's block is 32 contiguous values, so a dot product with one activation
block ends in a horizontal sum (8 lanes into 1), and per 8 output rows that reduction tree costs about
as much as the multiplies. Here one 32-byte load holds 4 consecutive values of 8 weight rows, one per
lane: vpdpbusd against 4 broadcast activation bytes adds into each row's own lane, and a block's 8
integer sums come out as one vector with no reduction (csrc/quant_dot.h's dot_group8). The scales of
the 8 rows sit side by side too, so they load as one vector instead of a gather.

Layout: rows 8g..8g+7 form group g; for each block b (in row order) group g holds one chunk of
8 x block bytes at byte (g * blocks_per_row + b) * 8 * block_bytes, which is where row 8g's block b
starts in the file's layout, so a grouped tensor keeps the [rows, row_bytes] shape and every byte
count. A chunk is: the 8 rows' f16 d (16 bytes); for Q4_1 their f16 m (16 bytes); then step t of
the values: 8 lanes x 4 bytes, lane l holding row l's bytes 4t..4t+3 of the block's values (for Q4
a byte holds value j in its low and value j + 16 in its high nibble, as in the file: steps 0-3 give
values 0-15 and, shifted, 16-31; for Q8_0 steps 0-7 give values 0-31). The products are the same
integers and are scaled in the same order as the file layout's, so a row gets the same bits either way.
"""
from __future__ import annotations

import functools

import torch

GROUP_ROWS = 8
GROUPED = {"Q4_0": "Q4_0_R8", "Q4_1": "Q4_1_R8", "Q8_0": "Q8_0_R8"}  # file type -> its grouped type
BASE = {grouped: base for base, grouped in GROUPED.items()}
C_FLAG = 8  # a grouped type's id in the C kernels: its base type's id | 8 (csrc/row_groups.h)
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # quant_blocks.py's (it imports this module)
_HEAD_BYTES = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2}  # f16 d (and m) before the values


def groupable(type_name: str, rows: int) -> bool:
    """A weight of this type and row count can be grouped (whole groups of 8 rows)."""
    return type_name in GROUPED and rows > 0 and rows % GROUP_ROWS == 0


def group(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """File-layout blocks [rows, row_bytes] of type_name (Q4_0, Q4_1, Q8_0) -> the same weight grouped."""
    if not groupable(type_name, blocks.shape[0]):
        raise ValueError(f"{type_name} blocks of {blocks.shape[0]} rows cannot be grouped by {GROUP_ROWS} rows")
    n, rb = blocks.shape
    bb, head = _BLOCK_BYTES[type_name], _HEAD_BYTES[type_name]
    g, nb = n // GROUP_ROWS, rb // bb
    b = blocks.reshape(g, GROUP_ROWS, nb, bb)
    scales = [b[..., at:at + 2].permute(0, 2, 1, 3).reshape(g, nb, 2 * GROUP_ROWS) for at in range(0, head, 2)]
    values = b[..., head:].reshape(g, GROUP_ROWS, nb, -1, 4).permute(0, 2, 3, 1, 4).reshape(g, nb, -1)
    return torch.cat([*scales, values], dim=-1).reshape(n, rb).contiguous()


def ungroup(groups: torch.Tensor, type_name: str) -> torch.Tensor:
    """A grouped weight [rows, row_bytes] of type_name (Q4_0_R8, ...) -> its blocks in the file's layout."""
    base = BASE[type_name]
    n, rb = groups.shape
    bb, head = _BLOCK_BYTES[base], _HEAD_BYTES[base]
    g, nb = n // GROUP_ROWS, rb // bb
    c = groups.reshape(g, nb, GROUP_ROWS * bb)
    width = 2 * GROUP_ROWS
    scales = [c[..., i * width:(i + 1) * width].reshape(g, nb, GROUP_ROWS, 2).permute(0, 2, 1, 3)
              for i in range(head // 2)]
    steps = (bb - head) // 4
    values = c[..., head * GROUP_ROWS:].reshape(g, nb, steps, GROUP_ROWS, 4).permute(0, 3, 1, 2, 4)
    return torch.cat([*scales, values.reshape(g, GROUP_ROWS, nb, steps * 4)], dim=-1).reshape(n, rb).contiguous()


@functools.cache
def _byte_map(type_name: str, row_bytes: int) -> torch.Tensor:
    """[8, row_bytes]: where byte j of a group's row l (in the file's layout) sits among the group's bytes."""
    return ungroup(torch.arange(GROUP_ROWS * row_bytes).reshape(GROUP_ROWS, row_bytes), type_name)


def rows_of(groups: torch.Tensor, type_name: str, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (1-D) of a grouped weight, as file-layout blocks [len(ids), row_bytes]: one gather of
    just their bytes (an embedding lookup per step)."""
    rb = groups.shape[1]
    starts = (ids // GROUP_ROWS * (GROUP_ROWS * rb)).unsqueeze(1)
    return groups.reshape(-1)[starts + _byte_map(type_name, rb)[ids % GROUP_ROWS]]
