"""Prefill tiles and the persistent kernel's work list: tiles of whole tokens (one TMA box each), every
tile exactly once in the list, the most key tiles first, tiles without tokens last, the kernel's
decoding of a tile id (CPU); persistent CTAs running many tiles each (GPU, skipped without sm_90)."""
from __future__ import annotations

import pytest
import torch

from cute_kernels.hopper.prefill.prefill_schedule import (
    kv_block_range,
    num_query_tiles,
    packed_row_token_head,
    tile_coords,
    tile_tokens,
)
from cute_kernels.hopper.prefill.prefill_spec import TileConfig
from cute_kernels.hopper.prefill.prefill_tile_order import longest_first_tiles, persistent_ctas
from tests.cute_kernels.hopper.test_prefill_attention import (
    LENGTH_MIX,
    PREFIX_MIX,
    assert_matches_reference,
    gpu,
    make_batch,
    run_kernel,
)


def _offsets(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def _python_cost(m_block, q_len, seqlen_k, group, tile, causal):
    tokens = tile_tokens(tile.tile_m, group)
    if m_block * tokens >= q_len:
        return -1
    return kv_block_range(m_block, q_len, seqlen_k, group, tokens * group, tile.tile_n, causal)[0]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("group,head_dim", [(1, 128), (4, 128), (3, 64), (8, 64)])
def test_every_tile_once_longest_first(group, head_dim, causal):
    q_lens, k_lens, prefixes, kv_heads = [1, 700, 4096, 130, 2049], [1, 700, 4096, 300, 2049], [0, 33, 0, 900, 5], 3
    tile = TileConfig.for_head_dim(head_dim, causal)
    max_q = max(q_lens)
    order = longest_first_tiles(_offsets(q_lens), _offsets(k_lens), torch.tensor(prefixes, dtype=torch.int32),
                                kv_heads, group, tile, causal, max_q)
    m_blocks = num_query_tiles(max_q, group, tile.tile_m)
    assert order.dtype == torch.int32 and sorted(order.tolist()) == list(range(len(q_lens) * kv_heads * m_blocks))
    costs = []
    for tile_id in order.tolist():
        m_block, kv_head, b = tile_coords(tile_id, m_blocks, kv_heads)
        assert 0 <= m_block < m_blocks and 0 <= kv_head < kv_heads and 0 <= b < len(q_lens)
        costs.append(_python_cost(m_block, q_lens[b], prefixes[b] + k_lens[b], group, tile, causal))
    assert costs == sorted(costs, reverse=True), "not longest first"
    assert costs[0] == -(-4096 // tile.tile_n) and costs.count(-1) > 0 and costs[-1] == -1
    assert tile_coords(order[0].item(), m_blocks, kv_heads)[2] == 2  # a tile of the longest sequence leads
    if causal:  # ... one of its last query tiles (those within one key tile of its end cost the most)
        tiles_per_key_tile = tile.tile_n // tile_tokens(tile.tile_m, group)
        assert tile_coords(order[0].item(), m_blocks, kv_heads)[0] >= m_blocks - tiles_per_key_tile - 1


def test_equal_costs_keep_sequence_head_tile_order():
    order = longest_first_tiles(_offsets([5, 5]), _offsets([5, 5]), torch.zeros(2, dtype=torch.int32), 2, 1,
                                TileConfig.for_head_dim(128), True, 5)
    assert order.tolist() == [0, 1, 2, 3]  # one tile per (sequence, head), one key tile each


def test_grid_is_one_cta_per_sm_and_never_more_than_tiles():
    assert persistent_ctas(10_000, torch.device("cpu")) == 132
    assert persistent_ctas(7, torch.device("cpu")) == 7 and persistent_ctas(0, torch.device("cpu")) == 1


@pytest.mark.parametrize("head_dim,causal", [(128, True), (64, True), (64, False)])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_tiles_hold_whole_tokens_as_one_tma_box(group, head_dim, causal):
    """Each tile is tile_tokens whole tokens (its Q load and O store one (d, group, tokens) box within
    TMA's 256-per-dimension limit, less than one token of padding rows); the tiles of a sequence cover
    every (token, head) once; only a sequence's last tile can be ragged (per-thread stores)."""
    tile = TileConfig.for_head_dim(head_dim, causal)
    tokens = tile_tokens(tile.tile_m, group)
    assert 0 <= tile.tile_m - tokens * group < group and max(tokens, group, head_dim) <= 256
    kv_heads, q_len = 2, 3 * tokens + 5
    assert num_query_tiles(q_len, group, tile.tile_m) == 4
    seen, ragged = [], []
    for kv_head in range(kv_heads):
        for m_block in range(num_query_tiles(q_len, group, tile.tile_m)):
            rows = range(m_block * tokens * group, (m_block + 1) * tokens * group)
            pairs = [packed_row_token_head(r, kv_head, group) for r in rows]
            seen += [p for p in pairs if p[0] < q_len]
            ragged.append((m_block + 1) * tokens > q_len)  # the epilogue's TMA-store test
    assert sorted(seen) == [(t, h) for t in range(q_len) for h in range(group * kv_heads)]
    assert ragged == [False, False, False, True] * kv_heads


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("num_ctas", [1, 3, 7])
@pytest.mark.parametrize("head_dim,causal", [(128, True), (64, True), (64, False)])
def test_persistent_ctas_take_many_tiles_gpu(head_dim, causal, num_ctas):
    """Far more tiles than CTAs: each CTA runs tens of tiles back to back, so the K/V ring positions,
    the Q buffer's phase, the ping-pong turn and the reuse of the output staging buffer all carry
    across tiles (and across the empty tiles past short sequences' ends, which CTAs skip)."""
    x = make_batch(LENGTH_MIX, PREFIX_MIX, 32, 8, head_dim, dtype=torch.bfloat16, device="cuda", seed=4)
    out, lse = run_kernel(x, head_dim ** -0.5, causal, True, num_ctas=num_ctas)
    assert_matches_reference(x, out, lse, head_dim ** -0.5, causal, True)
