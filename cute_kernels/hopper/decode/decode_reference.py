"""fp32 torch reference of what the split-KV decode kernel writes per split (partial O and LSE) and
of the merge, so GPU tests can compare the partials, not only the merged output. The merged result
is reference.decode_attention_ref's (a CPU test checks that too)."""
from __future__ import annotations

import math

import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.reference import gather_paged

from .decode_spec import KEYS_PER_TILE, split_tile_range


def _query_rows(args: DecodeArgs) -> list[tuple[int, int]]:
    """(first row, query tokens) of each sequence in q."""
    if args.cu_seqlens_q is None:
        return [(b, 1) for b in range(args.context_lens.numel())]
    cu = args.cu_seqlens_q.tolist()
    return [(cu[b], cu[b + 1] - cu[b]) for b in range(len(cu) - 1)]


def decode_split_ref(args: DecodeArgs, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [splits, tokens, H, d], LSE [splits, tokens, H]) in fp32: split s attends to its own key
    tiles only (decode_spec.split_tile_range), normalized over them; LSE in natural log, -inf (and
    O = 0) where a split holds no key visible to the row."""
    q = args.q.float()
    tokens, heads, d = q.shape
    hkv = args.k_cache.shape[2]
    o_part = torch.zeros(num_splits, tokens, heads, d)
    lse_part = torch.full((num_splits, tokens, heads), -math.inf)
    for b, (start, q_len) in enumerate(_query_rows(args)):
        ctx = int(args.context_lens[b])
        k = gather_paged(args.k_cache, args.block_tables[b], ctx).float().repeat_interleave(heads // hkv, 1)
        v = gather_paged(args.v_cache, args.block_tables[b], ctx).float().repeat_interleave(heads // hkv, 1)
        qb = q[start:start + q_len]  # [q_len, H, d]
        scores = torch.einsum("qhd,khd->hqk", qb, k) * args.scale
        last_visible = ctx - q_len + torch.arange(q_len)  # bottom-right causal
        keys = torch.arange(ctx)
        for s in range(num_splits):
            lo, hi = split_tile_range(s, num_splits, ctx)
            in_split = (keys >= lo * KEYS_PER_TILE) & (keys < hi * KEYS_PER_TILE)
            visible = in_split[None, :] & (keys[None, :] <= last_visible[:, None])  # [q_len, ctx]
            masked = scores.masked_fill(~visible[None], -math.inf)
            lse = torch.logsumexp(masked, -1)  # [H, q_len]
            p = torch.exp(masked - lse[..., None]).nan_to_num(0.0)
            o_part[s, start:start + q_len] = torch.einsum("hqk,khd->qhd", p, v)
            lse_part[s, start:start + q_len] = lse.T
    return o_part, lse_part


def merge_splits_ref(o_part: torch.Tensor, lse_part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge kernel's result: O = sum_s exp(LSE_s - LSE) O_s, LSE = logsumexp_s LSE_s."""
    lse = torch.logsumexp(lse_part, 0)
    weights = torch.exp(lse_part - lse[None]).nan_to_num(0.0)
    return (weights[..., None] * o_part.nan_to_num(0.0)).sum(0), lse
