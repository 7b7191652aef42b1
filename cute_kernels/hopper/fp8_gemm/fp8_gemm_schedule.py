"""Per-tile control flow of the FP8 GEMM (fp8_gemm.py), shared with the protocol model
(cute_kernels/hopper/protocol) and CPU tests.

Only + - * // % and the min / ceil_div passed in, so the same functions run on Python ints and on
DSL Int32 values inside the kernel (pass cutlass.min, cute.ceil_div). Divisions are of
non-negative values.

The CTA walks output tiles (m, n, l) from cutlass.utils.StaticPersistentTileScheduler; l is the
K split (one split: l == 0). Its producer warp and its consumer warpgroups each compute the tile's
k-tile range from split_k_range and agree without talking: they must, or one side waits for a stage
the other never fills or releases. The mainloop ring (stage, phase) is the DSL's PipelineState,
advanced once per k-tile on both sides, across tiles. The epilogue rotates EPI_STAGES shared-memory
buffers over the sub-tiles of consecutive tiles (epilogue_buffer).
"""
from __future__ import annotations

from .fp8_gemm_spec import TILE_K

PRODUCER_WARP = 0  # the warp of the producer warpgroup that issues the TMA loads
STORE_WARP = 4  # the first consumer warp issues the epilogue's TMA stores


def ceil_div(a, b):
    return (a + b - 1) // b


def k_tiles_per_split(k_tiles, splits, ceil=ceil_div):
    """k-tiles each split takes (the host picks a split count that leaves none empty)."""
    return ceil(k_tiles, splits)


def split_k_range(split, k_per_split, k_tiles, imin=min):
    """[k_begin, k_end) k-tiles of split `split` (the tile's l index)."""
    k_begin = split * k_per_split
    return k_begin, imin(k_begin + k_per_split, k_tiles)


def stage_tx_bytes(tile_m: int, tile_n: int) -> int:
    """Bytes the A and B k-tile copies of one stage bring (e4m3: one byte per element): the full
    barrier's expect-tx. A box past K or M is zero-filled by the TMA unit and still counts in full."""
    return (tile_m + tile_n) * TILE_K


def epilogue_buffer(tiles_done, num_subtiles: int, sub: int, stages: int):
    """Shared-memory buffer of sub-tile `sub` of the CTA's tiles_done-th tile: buffers rotate across
    tiles, so a store issued EPI_STAGES sub-tiles ago must have read it (wait_group(stages - 1))."""
    return (tiles_done * num_subtiles + sub) % stages
