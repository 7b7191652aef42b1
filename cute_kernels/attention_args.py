"""One argument record per attention kind, taken by every implementation of it: the torch reference,
the C CPU kernel and the CuTe (Hopper) host. Layouts: see cute_kernels/reference.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class PrefillArgs:
    """New query rows of several sequences over [paged prefix ; new keys], bottom-right causal."""

    q: torch.Tensor            # new tokens, packed [tokens, heads, d]
    k: torch.Tensor            # [tokens, kv_heads, d]
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor # int32 [n + 1]
    cu_seqlens_k: torch.Tensor # int32 [n + 1] (of the new keys)
    scale: float
    causal: bool = True
    k_cache: torch.Tensor | None = None   # paged [num_blocks, block_size, kv_heads, d]
    v_cache: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None  # int32 [n, max_blocks]
    prefix_lens: torch.Tensor | None = None   # int32 [n] cached tokens before each chunk; None = no prefix
    max_seqlen_q: int | None = None           # from the step plan, so no backend syncs to learn it
    plan: Any = None   # backend precomputation shared by every layer of one step (e.g. C tables)
    k_scale: torch.Tensor | None = None  # fp32 [kv_heads]: an fp8_e4m3 cache holds x / scale (x = stored * scale)
    v_scale: torch.Tensor | None = None


@dataclass
class DecodeArgs:
    """New query tokens over each sequence's whole paged context: one per sequence, or (speculative
    verification) a few, bottom-right causal among themselves."""

    q: torch.Tensor            # [batch, heads, d]; with cu_seqlens_q, packed [tokens, heads, d]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor # int32 [batch, max_blocks]
    context_lens: torch.Tensor # int32 [batch], including the new token(s)
    scale: float
    plan: Any = None
    cu_seqlens_q: torch.Tensor | None = None  # int32 [batch + 1]; None: one query token per sequence
    k_scale: torch.Tensor | None = None  # fp32 [kv_heads]: an fp8_e4m3 cache holds x / scale (x = stored * scale)
    v_scale: torch.Tensor | None = None


def check_queries_see_keys(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           prefix_lens: torch.Tensor | None) -> None:
    """ValueError when a sequence has more queries than keys ([prefix ; new keys]): under the bottom-right
    causal alignment its first queries would see no key at all (every implementation refuses the shape,
    so none gives it a meaning of its own). Reads the lengths on the host."""
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
    k_lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
    prefixes = prefix_lens.tolist() if prefix_lens is not None else [0] * len(q_lens)
    for b, (lq, lk, prefix) in enumerate(zip(q_lens, k_lens, prefixes)):
        if lq > prefix + lk:
            raise ValueError(f"prefill attention: sequence {b} has {lq} queries but {prefix + lk} keys "
                             f"({prefix} cached + {lk} new): its first queries would see no key")
