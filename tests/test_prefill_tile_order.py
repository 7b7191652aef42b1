"""The persistent prefill kernel's work list (CPU): every tile exactly once, the most key tiles first,
tiles without tokens last, and the kernel's decoding of a tile id."""
from __future__ import annotations

import pytest
import torch

from cute_kernels.hopper.prefill_schedule import kv_block_range, num_query_tiles, tile_coords, tile_tokens
from cute_kernels.hopper.prefill_spec import TileConfig
from cute_kernels.hopper.prefill_tile_order import longest_first_tiles, persistent_ctas


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
