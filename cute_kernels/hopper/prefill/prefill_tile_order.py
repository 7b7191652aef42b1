"""The persistent prefill kernel's work list: every query tile of a step, longest first (pure torch).

A tile is (query tile m_block, KV head, sequence), named by its linear id (batch * kv_heads + kv_head) *
num_m_blocks + m_block (prefill_schedule.tile_coords inverts it in the kernel). Its cost is the number
of key tiles it visits (kv_block_range): under a causal mask the last query tiles of long sequences
cost the most, so a grid of one CTA per SM that takes tiles in this order starts the long ones first
and fills the end with short ones (longest-processing-time first). Tiles past a sequence's last
token cost nothing and come last (the kernel skips them). Built with torch ops on the device of
cu_seqlens (no host sync), once per step and shape (PrefillPlan caches it for every layer).
"""
from __future__ import annotations

import functools

import torch

from .prefill_schedule import ceil_div, kv_block_range, num_query_tiles, tile_tokens
from .prefill_spec import TileConfig

CPU_COMPILE_SMS = 132  # H100 SXM's SM count: the grid the CPU compile path assumes


def _tmin(a, b):
    return torch.minimum(a, b) if isinstance(b, torch.Tensor) else a.clamp(max=b)


def _tmax(a, b):
    return torch.maximum(a, b) if isinstance(b, torch.Tensor) else a.clamp(min=b)


def tile_costs(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, prefix_lens: torch.Tensor, group: int,
               tile: TileConfig, causal: bool, max_seqlen_q: int) -> torch.Tensor:
    """int64 [batch, num_m_blocks]: key tiles each query tile visits; -1 where it holds no token."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    q_lens = (cu_q[1:] - cu_q[:-1])[:, None]
    seqlen_k = (prefix_lens.long() + cu_k[1:] - cu_k[:-1])[:, None]
    tokens = tile_tokens(tile.tile_m, group)
    m_block = torch.arange(num_query_tiles(max_seqlen_q, group, tile.tile_m), device=cu_q.device)[None, :]
    if causal:
        n_max, _ = kv_block_range(m_block, q_lens, seqlen_k, group, tokens * group, tile.tile_n, True,
                                  imin=_tmin, imax=_tmax)
    else:
        n_max = ceil_div(seqlen_k, tile.tile_n).expand(-1, m_block.shape[1])
    return torch.where(m_block * tokens < q_lens, n_max, -1)


def longest_first_tiles(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, prefix_lens: torch.Tensor,
                        kv_heads: int, group: int, tile: TileConfig, causal: bool, max_seqlen_q: int) -> torch.Tensor:
    """int32 [batch * kv_heads * num_m_blocks] linear tile ids, most key tiles first (stable: ties keep
    sequence, head, m_block order)."""
    costs = tile_costs(cu_seqlens_q, cu_seqlens_k, prefix_lens, group, tile, causal, max_seqlen_q)
    per_head = costs[:, None, :].expand(-1, kv_heads, -1).reshape(-1)
    order = torch.sort(per_head, descending=True, stable=True).indices
    return order.to(torch.int32)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_ctas(num_tiles: int, device: torch.device) -> int:
    """One CTA per SM (the kernel's shared memory and registers hold one), never more than tiles."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else CPU_COMPILE_SMS
    return max(1, min(num_tiles, sms))
