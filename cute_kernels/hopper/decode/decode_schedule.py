"""Index arithmetic of the split-KV decode kernel (decode_attention.py) and its merge (decode_merge.py),
shared with their CPU tests and the protocol model (cute_kernels/hopper/protocol).

Only + - * // % and the min passed in, so the same functions run on Python ints (tests, the numpy
emulation, the protocol model) and on DSL Int32 values inside the kernel (pass cutlass.min). All
divisions are of non-negative values, where C's truncation and Python's floor agree. The merge's two
formulas take exp2 / log2 as arguments for the same reason (cute.math inside the kernel, numpy here).

A CTA is (split, KV head, sequence). Its key tiles are KEYS_PER_TILE keys = BLOCKS_PER_TILE cache
blocks; local tile i of the split is key tile tile_lo + i. The producer warp reads block-table
entries TABLE_GROUP at a time (one per lane), one group ahead of use, and shuffles each tile's
blocks out of the current group. Columns past the context's last block are clamped to it: those
keys are masked (scores by select, V rows zeroed), so any valid block will do, and the clamp keeps
every read inside the table row.
"""
from __future__ import annotations

import math

from cute_kernels.paged_tables import KV_BLOCK_SIZE

from .decode_spec import BLOCKS_PER_TILE, KEYS_PER_TILE

TABLE_GROUP = 32  # block-table entries the producer warp reads at once, one per lane
TILES_PER_GROUP = TABLE_GROUP // BLOCKS_PER_TILE
LOG2_E = math.log2(math.e)


def split_tiles(split, num_splits, context_len, imin=min):
    """(tile_lo, n_local): the split's first key tile and how many it owns. The sequence's tiles in
    equal contiguous runs; the last runs may be short or empty (n_local == 0: nothing to load)."""
    n_tiles = (context_len + KEYS_PER_TILE - 1) // KEYS_PER_TILE
    per_split = (n_tiles + num_splits - 1) // num_splits
    tile_lo = imin(split * per_split, n_tiles)
    return tile_lo, imin(tile_lo + per_split, n_tiles) - tile_lo


def last_table_column(context_len):
    """The table column holding the context's last key (context_len >= 1)."""
    return (context_len - 1) // KV_BLOCK_SIZE


def table_column(tile_lo, group_index, lane, last_col, imin=min):
    """Column lane `lane` reads for table group group_index of a split starting at key tile tile_lo."""
    return imin(tile_lo * BLOCKS_PER_TILE + group_index * TABLE_GROUP + lane, last_col)


def block_lane(i, j):
    """The lane of the current table group holding block j of local tile i."""
    return (i % TILES_PER_GROUP) * BLOCKS_PER_TILE + j


def refills_table_group(i):
    """Whether local tile i is the last of its group: the next group's entries take over, and the
    group after that is read (a group ahead)."""
    return i % TILES_PER_GROUP == TILES_PER_GROUP - 1


def next_table_group(i):
    """The group read after local tile i's refill: the current one is i // TILES_PER_GROUP, the next
    was read a group ago."""
    return i // TILES_PER_GROUP + 2


def stage_tx_bytes(head_dim: int, elem_bytes: int) -> int:
    """Bytes the TMA copies of one stage bring (K and V of a key tile): its full barrier's expect-tx."""
    return 2 * KEYS_PER_TILE * head_dim * elem_bytes


def mask_from(context_len, q_len):
    """Keys at or past this position are hidden from some query row (its later tokens, the tail)."""
    return context_len - q_len + 1


def tile_needs_mask(tile, mask_from_key):
    """Whether key tile `tile` reaches a key some row must not see."""
    return (tile + 1) * KEYS_PER_TILE > mask_from_key


def tile_valid_keys(tile, context_len):
    """Keys of tile `tile` inside the context: V rows from here on are zeroed (the slots may hold NaN)."""
    return context_len - tile * KEYS_PER_TILE


def key_limit(token, tile, context_len, q_len):
    """First column of key tile `tile` that query `token` must not see (bottom-right causal)."""
    return context_len - q_len + token + 1 - tile * KEYS_PER_TILE


def packed_row(row, kv_head, group):
    """Packed query row -> (query token, query head): rows are (token, query head of this KV head)."""
    return row // group, kv_head * group + row % group


def padding_token(token, q_len, imin=min):
    """Rows past the last token (padding, never stored) repeat the last token: finite scores."""
    return imin(token, q_len - 1)


def merge_pair(pair, heads):
    """The merge kernel's warp `pair` -> (query row, query head)."""
    return pair // heads, pair % heads


def split_weight(lse_split, top, exp2):
    """Unnormalized weight of a split with LSE lse_split (natural log) under the rows' max LSE `top`."""
    return exp2((lse_split - top) * LOG2_E)


def merged_lse(top, total, log2):
    """Natural-log LSE of the merged row: top + ln(sum of the weights)."""
    return top + log2(total) / LOG2_E
