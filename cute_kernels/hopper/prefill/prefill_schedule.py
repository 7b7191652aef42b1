"""Index arithmetic of the prefill kernel, shared by the kernel and its CPU tests.

Only + - * // and the min/max passed in, so the same functions run on Python ints (tests, host) and on
DSL Int32 values inside the kernel (pass cutlass.min / cutlass.max). All divisions are of
non-negative values, where C's truncation and Python's floor agree.

Packed-GQA rows: a CTA owns KV head hk and packed rows r = token * group + g of one sequence, i.e.
query head hk * group + g of query token `token`; the group's heads share each K/V tile load.
A tile holds whole tokens: tile_tokens(tile_m, group) tokens, i.e. tile_tokens * group packed rows
(126 of 128 at group 3; the rest are padding, never stored), so its Q and O rows are one TMA box
(head_dim, group, tokens) of the [tokens, heads, head_dim] tensor.
Key positions: sequence b's keys are [paged prefix (prefix_len tokens) ; new keys]; query token t
sits at key position seqlen_k - q_len + t (bottom-right causal alignment).
"""
from __future__ import annotations


def ceil_div(a, b):
    return (a + b - 1) // b


def packed_row_token_head(row, kv_head, group: int):
    """Packed query row -> (query token within the sequence, query head)."""
    return row // group, kv_head * group + row % group


def query_key_position(token, q_len, seqlen_k):
    """Last key position query `token` may attend to (bottom-right aligned causal)."""
    return seqlen_k - q_len + token


def key_row_coords(key_pos, prefix_len, k_start, block_size: int):
    """Where key position key_pos lives: (block-table column, slot in block) if key_pos < prefix_len,
    else row k_start + key_pos - prefix_len of the packed new k/v. The caller selects on key_pos < prefix_len."""
    return key_pos // block_size, key_pos % block_size, k_start + key_pos - prefix_len


def tile_tokens(tile_m: int, group: int) -> int:
    """Query tokens per tile: whole tokens, each with its group of packed rows."""
    return tile_m // group


def kv_block_range(m_block, q_len, seqlen_k, group: int, tile_rows: int, tile_n: int, causal: bool,
                   imin=min, imax=max):
    """(n_block_max, n_mask_start) for query tile m_block of tile_rows packed rows (tile_tokens * group).

    The kernel visits key tiles n_block_max-1 down to 0; tiles n >= n_mask_start need the causal
    and/or key-length mask, the rest are fully visible. Tiles at or beyond n_block_max are fully
    masked for every row of this query tile and are skipped.
    """
    n_total = ceil_div(seqlen_k, tile_n)
    n_unpadded = seqlen_k // tile_n  # tiles with no key beyond seqlen_k
    if not causal:
        return n_total, n_unpadded
    packed_rows = q_len * group
    last_row = imin((m_block + 1) * tile_rows, packed_rows) - 1
    last_key = query_key_position(last_row // group, q_len, seqlen_k)
    n_max = imin(n_total, ceil_div(imax(last_key + 1, 0), tile_n))
    first_key = query_key_position((m_block * tile_rows) // group, q_len, seqlen_k)
    n_mask_start = imin(imax(first_key + 1, 0) // tile_n, n_unpadded)
    return n_max, n_mask_start


def ring_slot(pos, stages: int):
    """(stage, phase bit) of K/V ring position pos: the producer and the consumers count positions alike."""
    return pos % stages, (pos // stages) % 2


def tile_has_rows(m_block, tile_tokens: int, q_len):
    """Whether query tile m_block holds any token of its sequence (tiles past the end do no work)."""
    return m_block * tile_tokens < q_len


def loads_key_tiles(n_block_max):
    """Whether a tile with rows loads Q and key tiles at all: with n_block_max == 0 (its queries see no
    key; the host refuses such input) the producer loads nothing and the consumers write O = 0 and
    LSE = -inf without waiting for any stage, so neither side waits for the other."""
    return n_block_max > 0


def num_query_tiles(max_seqlen_q: int, group: int, tile_m: int) -> int:
    """Grid extent over query tokens (tiles past a short sequence's end exit at once)."""
    return ceil_div(max_seqlen_q, tile_tokens(tile_m, group))


def tile_coords(tile_id, num_m_blocks, kv_heads):
    """Linear tile id (batch * kv_heads + kv_head) * num_m_blocks + m_block -> (m_block, kv_head, batch)."""
    seq_head = tile_id // num_m_blocks
    batch = seq_head // kv_heads
    return tile_id - seq_head * num_m_blocks, seq_head - batch * kv_heads, batch
