"""TMA views of a prefill tile's packed query rows: Q loads and O stores as one box per tile.

A tile's packed rows are (token, query head of the group) with the head fastest, i.e. rows
token * group + g of tokens m_block * tile_tokens ... In the [tokens, heads, head_dim] tensor these are
head_dim x group x tile_tokens elements starting at (token0, kv_head * group, 0): one 3D box of the
(head_dim, heads, tokens) tensor map, whatever the group (tile_tokens whole tokens per tile, see
prefill_schedule). The shared-memory side views the same swizzled [tile_m, head_dim] tile the wgmma
reads as (group, tile_tokens, head_dim): rows of a 64-column swizzle span are evenly spaced, so
row token * group + g is a plain strided coordinate.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync


def packed_rows_gmem(mX: cute.Tensor, group: int, kv_heads) -> cute.Tensor:
    """[tokens, heads, d] as (group, tokens, d, kv_heads): head kv_head * group + g is (g, ..., kv_head)."""
    head_stride = mX.stride[1]
    layout = cute.make_layout((group, mX.shape[0], mX.shape[2], kv_heads),
                              stride=(head_stride, mX.stride[0], 1, head_stride * group))
    return cute.make_tensor(mX.iterator, layout)


def packed_rows_smem_layout(s_layout: cute.ComposedLayout, group: int, tokens: int) -> cute.ComposedLayout:
    """The swizzled [tile_m, d] layout ((8, R), (W, C)) : ((W, 8W), (1, tile_m * W)) (W columns per
    swizzle span) seen as (group, tokens, (W, C)): row r = t * group + g sits at r * W in its span."""
    outer = s_layout.outer
    row_stride = outer.stride[0][0]
    assert outer.stride[0][1] == 8 * row_stride, "rows of a swizzle span must be evenly spaced"
    cols = cute.make_layout(outer.shape[1], stride=outer.stride[1])
    rows_cols = cute.make_layout((group, tokens, cols.shape), stride=(row_stride, row_stride * group, cols.stride))
    return cute.make_composed_layout(s_layout.inner, 0, rows_cols)


def packed_rows_tma(op, mX: cute.Tensor, s_layout, group: int, tokens: int, kv_heads):
    """(atom, TMA tensor) moving one tile's packed rows between mX and shared memory (op: load or store)."""
    box = packed_rows_smem_layout(s_layout, group, tokens)
    info = cpasync.make_tiled_tma_atom(op, packed_rows_gmem(mX, group, kv_heads), box,
                                       (group, tokens, cute.size(s_layout.outer, mode=[1])))
    return info.atom, info.tma_tensor


def packed_rows_partition(atom, mX_tma: cute.Tensor, sX_box: cute.Tensor, group: int, tokens: int,
                          kv_head: Int32, token_start: Int32, m_block: Int32):
    """(shared, global) operands of the one TMA copy of tile m_block of the sequence whose first token
    is token_start; sX_box is the tile's shared memory in packed_rows_smem_layout."""
    head = cute.domain_offset((0, token_start, 0), mX_tma[None, None, None, kv_head])
    gX = cute.local_tile(head, (group, tokens, cute.size(sX_box, mode=[2])), (0, m_block, 0))
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(sX_box, 0, 3),
                                 cute.group_modes(gX, 0, 3))
