"""Attention references with static shapes and no host synchronization, so a CUDA graph can capture
them. Same contract as reference.decode_attention_ref; slower, since every sequence attends over the
whole width of its block table (masked past its length) instead of its own length."""
from __future__ import annotations

import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.kv_quant import dequantize


class StaticDecodePlan:
    """DecodeArgs.plan of a step that must not synchronize: decode with decode_attention_static_ref."""


def decode_attention_static_ref(args: DecodeArgs) -> torch.Tensor:
    """q [B, H, d] over the first context_lens[b] tokens behind block_tables[b]: fp32 scores and softmax,
    GQA by head ratio; K/V of the table's full width are gathered, the tail masked to -inf."""
    q, k_cache, v_cache = args.q, args.k_cache, args.v_cache
    batch, width = args.block_tables.shape
    bs, kv_heads, d = k_cache.shape[1:]
    tables = args.block_tables.long()
    scales = args.kv_scales
    k = dequantize(k_cache[tables].view(batch, width * bs, kv_heads, d), scales and scales.k)
    v = dequantize(v_cache[tables].view(batch, width * bs, kv_heads, d), scales and scales.v)
    qg = q.float().view(batch, kv_heads, q.shape[1] // kv_heads, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * args.scale
    past_end = torch.arange(width * bs, device=q.device) >= args.context_lens.unsqueeze(1)  # [B, L]
    scores.masked_fill_(past_end[:, None, None, :], float("-inf"))
    out = torch.einsum("bhgl,blhd->bhgd", scores.softmax(-1), v)
    return out.reshape(q.shape).to(q.dtype)
