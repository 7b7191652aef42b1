"""The torch references every backend is tested against: attention (prefill, paged decode, KV write)
and the fused elementwise ops of a decoder layer. The torch backend runs exactly these.

Layouts (FlashAttention varlen style):
- q, k, v: packed [total_tokens, heads, head_dim]; sequence b owns rows cu_seqlens[b]:cu_seqlens[b+1].
- KV cache per layer: [num_blocks, block_size, kv_heads, head_dim]; block_tables [batch, max_blocks]
  int32 (padded with any valid id), token t of a sequence lives in block block_tables[b, t // bs].
- GQA: query head h reads KV head h // (heads // kv_heads).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from cute_kernels.attention_args import DecodeArgs, PrefillArgs, check_queries_see_keys
from cute_kernels.kv_quant import KVScales, dequantize, is_quantized, quantize


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
    kv_scales: KVScales | None = None,
) -> None:
    """Scatter new k/v [tokens, kv_heads, d] into the caches at flat slots (block * bs + offset), rounded
    to the caches' dtype (nearest even) where it differs; an int8 / e4m3 cache quantized with kv_scales
    (cute_kernels/kv_quant.py)."""
    ks, vs = (kv_scales.k, kv_scales.v) if kv_scales is not None else (None, None)
    for cache, x, scale in ((k_cache, k, ks), (v_cache, v, vs)):
        rows = quantize(x, cache.dtype, scale)
        if cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no float8 kernel: copy the bytes
            cache, rows = cache.view(torch.uint8), rows.view(torch.uint8)
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, rows)


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence from a paged cache: [length, kv_heads, d]."""
    bs = cache.shape[1]
    nblocks = (length + bs - 1) // bs
    return cache[block_table[:nblocks].long()].flatten(0, 1)[:length]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
          square_causal: bool = False) -> torch.Tensor:
    """q [B, Lq, H, d], k/v [B, Lk, Hkv, d] -> [B, Lq, H, d], fp32 softmax, GQA by head ratio.

    A square causal block (no prefix) uses SDPA's built-in causal path, which skips masked tiles.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
        attn_mask=None if square_causal else mask, is_causal=square_causal, scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
    )
    return out.transpose(1, 2)


def _prefix(cache: torch.Tensor, table: torch.Tensor, length: int, scales: KVScales | None, which: int,
            dtype: torch.dtype) -> torch.Tensor:
    """A sequence's cached prefix; an int8 / e4m3 cache's dequantized to dtype (which: 0 K, 1 V)."""
    rows = gather_paged(cache, table, length)
    if not is_quantized(cache.dtype):
        return rows  # torch.cat promotes a bf16 prefix exactly
    return dequantize(rows, (scales.k, scales.v)[which], dtype)


def _prefill_sequences(args: PrefillArgs):
    """Per sequence: (its query rows' slice, q [lq, H, d], keys and values [lk, Hkv, d] = [paged prefix ;
    new keys]); query row i sits at key position lk - lq + i (bottom-right causal alignment)."""
    q, k, v = args.q, args.k, args.v
    cq = args.cu_seqlens_q.tolist()
    ck = args.cu_seqlens_k.tolist()
    prefixes = args.prefix_lens.tolist() if args.prefix_lens is not None else [0] * (len(cq) - 1)
    for b in range(len(cq) - 1):
        kb, vb = k[ck[b] : ck[b + 1]], v[ck[b] : ck[b + 1]]
        if prefixes[b]:
            kb = torch.cat([_prefix(args.k_cache, args.block_tables[b], prefixes[b], args.kv_scales, 0, kb.dtype), kb])
            vb = torch.cat([_prefix(args.v_cache, args.block_tables[b], prefixes[b], args.kv_scales, 1, vb.dtype), vb])
        yield slice(cq[b], cq[b + 1]), q[cq[b] : cq[b + 1]], kb, vb


def prefill_attention_ref(args: PrefillArgs) -> torch.Tensor:
    """Varlen attention of new queries over [paged prefix ; new keys].

    Sequence b's keys are its first prefix_lens[b] tokens read from the paged cache through
    block_tables[b], followed by k/v rows cu_seqlens_k[b]:cu_seqlens_k[b+1]. Query row i of sequence
    b sits at key position prefix_len + (new_k_len - q_len) + i (bottom-right causal alignment).
    max_seqlen_q and plan are not needed here.
    """
    check_queries_see_keys(args.cu_seqlens_q, args.cu_seqlens_k, args.prefix_lens)
    causal, scale = args.causal, args.scale
    out = torch.empty_like(args.q)
    for rows, qb, kb, vb in _prefill_sequences(args):
        lq, lk = qb.shape[0], kb.shape[0]
        mask = None
        if causal and 1 < lq < lk:  # a chunk after a prefix: bottom-right aligned mask
            qpos = torch.arange(lk - lq, lk, device=qb.device).unsqueeze(1)
            mask = torch.arange(lk, device=qb.device).unsqueeze(0) <= qpos
        out[rows] = _sdpa(qb[None], kb[None], vb[None], mask, scale, causal and lq == lk > 1)[0]
    return out


def prefill_lse_ref(args: PrefillArgs, chunk: int = 512) -> torch.Tensor:
    """fp32 [total_q, heads] natural-log sum of exp(scale * q.k) over each query's visible keys
    (prefill_attention_ref's mask), in chunks of query rows to bound the score matrix's memory."""
    lse = torch.empty(args.q.shape[0], args.q.shape[1], dtype=torch.float32, device=args.q.device)
    for rows, qb, kb, _ in _prefill_sequences(args):
        lq, lk = qb.shape[0], kb.shape[0]
        group = qb.shape[1] // kb.shape[1]
        keys = kb.float().repeat_interleave(group, 1)  # [lk, H, d]
        for start in range(0, lq, chunk):
            qc = qb[start : start + chunk].float()
            scores = torch.einsum("qhd,khd->hqk", qc, keys) * args.scale
            if args.causal:
                qpos = torch.arange(lk - lq + start, lk - lq + start + qc.shape[0], device=qb.device)
                scores.masked_fill_(torch.arange(lk, device=qb.device)[None, None, :] > qpos[None, :, None],
                                    float("-inf"))
            lse[rows.start + start : rows.start + start + qc.shape[0]] = torch.logsumexp(scores, -1).T
    return lse


DecodePlan = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]


def plan_decode(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                seqs_per_bucket: int = 8) -> DecodePlan:
    """Group sequences of similar length and precompute their flat cache slots.

    Gathering paged KV into a padded batch costs memory traffic proportional to the padding, so
    sequences are sorted by length and split into buckets small enough that a bucket's K/V stay in
    cache between the ops that use them. The plan depends only on the block tables, so one plan
    serves every layer of a step. Returns (seq indices, flat slots [b * L], valid [b, 1, L] or None).
    """
    order = torch.argsort(context_lens, descending=True)
    plan = []
    for idx in torch.split(order, seqs_per_bucket):
        lens = context_lens[idx].long()
        pos = torch.arange(int(lens.max()), device=block_tables.device)
        slots = block_tables[idx][:, pos // block_size].long() * block_size + pos % block_size
        padded = bool(lens.min() < lens.max())  # only a bucket of unequal lengths has padding to mask
        valid = (pos.unsqueeze(0) < lens.unsqueeze(1)).unsqueeze(1) if padded else None
        plan.append((idx, slots.view(-1), valid))
    return plan


def decode_attention_ref(args: DecodeArgs) -> torch.Tensor:
    """One query token per sequence over its whole paged context: q [B, H, d] -> [B, H, d].
    With args.cu_seqlens_q (speculative verification): several tokens per sequence, the last ones
    of its context, each seeing the keys up to its own position (decode_verify_ref).

    K/V rows are gathered whole ([L, Hkv * d], one contiguous copy, never repeated per query head);
    each query head is placed in a block-diagonal row so that one batched product [H, Hkv * d] x
    [Hkv * d, L] scores every head against its own KV head (zeros elsewhere). That orientation is
    several times faster on CPU BLAS than [L, .] x [., H], and the softmax runs on contiguous rows.
    """
    if args.cu_seqlens_q is not None:
        return decode_verify_ref(args)
    q, k_cache, v_cache, scale = args.q, args.k_cache, args.v_cache, args.scale
    plan = args.plan if args.plan is not None else plan_decode(args.block_tables, args.context_lens, k_cache.shape[1])
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    heads = q.shape[1]
    head_of = torch.arange(heads, device=q.device)
    kv_head_of = head_of // (heads // hkv)
    keys, values = k_cache.view(-1, hkv * d), v_cache.view(-1, hkv * d)
    ks, vs = (args.kv_scales.k, args.kv_scales.v) if args.kv_scales is not None else (None, None)
    out = torch.empty_like(q)
    for idx, slots, valid in plan:
        b, length = len(idx), slots.numel() // len(idx)
        k = dequantize(keys.index_select(0, slots).view(b, length, hkv, d), ks).view(b, length, hkv * d)
        v = dequantize(values.index_select(0, slots).view(b, length, hkv, d), vs).view(b, length, hkv * d)
        blockdiag = torch.zeros(b, heads, hkv, d, device=q.device)
        blockdiag[:, head_of, kv_head_of] = q[idx].float()
        scores = torch.bmm(blockdiag.view(b, heads, hkv * d), k.transpose(1, 2))  # [b, H, L]
        scores.mul_(scale)
        if valid is not None:
            scores.masked_fill_(~valid, float("-inf"))
        full = torch.bmm(scores.softmax(-1), v).view(b, heads, hkv, d)
        out[idx] = full[:, head_of, kv_head_of].to(q.dtype)
    return out


def decode_verify_ref(args: DecodeArgs) -> torch.Tensor:
    """Several query tokens per sequence over its paged context: a prefill of no new keys whose
    prefix is the whole context (the queries' own keys are in the cache already), so query i of a
    sequence of q_len tokens sits at key position context_len - q_len + i (bottom-right causal)."""
    empty = args.q.new_zeros(0, args.k_cache.shape[2], args.k_cache.shape[3])
    zeros = torch.zeros_like(args.cu_seqlens_q)
    return prefill_attention_ref(PrefillArgs(
        args.q, empty, empty, args.cu_seqlens_q, zeros, args.scale, True, args.k_cache, args.v_cache,
        args.block_tables, args.context_lens, kv_scales=args.kv_scales))


# -- fused elementwise ops of a decoder layer ---------------------------------------------------

def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); residual None means zeros."""
    residual = x if residual is None else x + residual
    return F.rms_norm(residual, (x.shape[-1],), weight, eps), residual


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(first half of the last dim) * second half."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, d] rotated by cos/sin [tokens, 1, d/2] (rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def fp8_gemm_ref(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C[M, N] = A[M, K] x B[N, K]^T of e4m3 operands, each scaled as fp8_quant.dequantize reads its
    scales (rowwise, or per-token x 128x128 blocks): an fp32 matmul of the exact dequantized values."""
    from cute_kernels.fp8_quant import dequantize

    return (dequantize(a, scale_a) @ dequantize(b, scale_b).T).to(out_dtype)
