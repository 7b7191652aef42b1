"""A numpy emulation of the split-KV decode kernel and its merge, driven by hopper/decode/decode_schedule.py
(the functions the kernels call): each CTA's split range, the block-table columns its producer
lanes read (clamped, a group ahead) and shuffle out per tile, the packed (token, head) rows with
padding, the mask and V-tail tests, the kernel's exp2 online softmax and LSE, then decode_merge's
weights. Run over shuffled block tables with NaN in every slot no sequence owns, empty splits
(more splits than tiles) and several query tokens per sequence, in float64, against
cute_kernels.reference.decode_attention_ref (CPU, fp32) and a plain logsumexp; each test of a broken
schedule function shows the comparison (or the emulation's bounds check) fails."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.hopper.decode import decode_schedule
from cute_kernels.hopper.decode.decode_spec import BLOCKS_PER_TILE, KEYS_PER_TILE, QUERY_ROWS, split_tile_range
from cute_kernels.reference import decode_attention_ref

BLOCK = 16


def make_case(lens, q_lens, heads, kv_heads, d, seed=0) -> DecodeArgs:
    """Blocks of each sequence scattered through a pool with spare blocks; table rows one column wider
    than the longest context, padded with random ids; NaN in every slot no sequence owns."""
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(blocks) + 7
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.randint(0, num_blocks, (len(lens), max(blocks) + 1), generator=g, dtype=torch.int32)
    caches = [torch.randn(num_blocks, BLOCK, kv_heads, d, generator=g) for _ in range(2)]
    owned = torch.zeros(num_blocks, BLOCK, dtype=torch.bool)
    start = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[start:start + n].int()
        start += n
        t = torch.arange(lens[b])
        owned[tables[b, t // BLOCK].long(), t % BLOCK] = True
    for c in caches:
        c[~owned] = float("nan")
    q = torch.randn(sum(q_lens), heads, d, generator=g)
    cu = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    return DecodeArgs(q, caches[0], caches[1], tables, torch.tensor(lens, dtype=torch.int32), d ** -0.5,
                      cu_seqlens_q=None if max(q_lens) == 1 else cu)


def reference_out(args: DecodeArgs) -> np.ndarray:
    """decode_attention_ref on the same values with the poison zeroed: the reference gathers whole
    blocks and masks by weight (0 x NaN is NaN), the kernel must not read those slots at all."""
    clean = DecodeArgs(args.q, args.k_cache.nan_to_num(0.0), args.v_cache.nan_to_num(0.0), args.block_tables,
                       args.context_lens, args.scale, cu_seqlens_q=args.cu_seqlens_q)
    return decode_attention_ref(clean).double().numpy()


def _table_entries(table_row: np.ndarray, tile_lo: int, n_local: int, ctx: int, sched) -> list[list[int]]:
    """The producer warp: 32 lanes read a table group each (one group ahead), tile i's blocks are
    shuffled out of the current group. IndexError on a column outside the row (the GPU reads garbage)."""
    last_col = sched.last_table_column(ctx)

    def group(index):
        cols = [sched.table_column(tile_lo, index, lane, last_col) for lane in range(32)]
        if min(cols) < 0 or max(cols) >= len(table_row):
            raise IndexError(f"block-table column {max(cols)} outside a row of {len(table_row)}")
        return [int(table_row[c]) for c in cols]

    entries, next_entries, out = group(0), group(1), []
    for i in range(n_local):
        out.append([entries[sched.block_lane(i, j)] for j in range(BLOCKS_PER_TILE)])
        if sched.refills_table_group(i):
            entries, next_entries = next_entries, group(sched.next_table_group(i))
    return out


def _cta(q, kc, vc, table_row, ctx, q_start, q_len, kv_head, group, split, splits, scale_log2, sched):
    """One CTA's consumer warpgroup: (rows kept, query token, head, O / sum, natural-log LSE)."""
    tile_lo, n_local = sched.split_tiles(split, splits, ctx)
    rows = np.arange(QUERY_ROWS)
    token, head = sched.packed_row(rows, kv_head, group)
    q_rows = q[q_start + sched.padding_token(token, q_len, np.minimum), head]  # padding rows: the last token
    row_max, row_sum = np.full(QUERY_ROWS, -np.inf), np.zeros(QUERY_ROWS)
    acc = np.zeros((QUERY_ROWS, q.shape[-1]))
    mask_from = sched.mask_from(ctx, q_len)
    for i, blocks in enumerate(_table_entries(table_row, tile_lo, n_local, ctx, sched)):
        tile = tile_lo + i
        k = kc[blocks, :, kv_head].reshape(KEYS_PER_TILE, -1)
        v = vc[blocks, :, kv_head].reshape(KEYS_PER_TILE, -1).copy()
        s = q_rows @ k.T
        if sched.tile_needs_mask(tile, mask_from):
            limit = sched.key_limit(sched.padding_token(token, q_len, np.minimum), tile, ctx, q_len)
            s = np.where(np.arange(KEYS_PER_TILE)[None, :] >= limit[:, None], -np.inf, s)  # a select: NaN goes too
            valid = sched.tile_valid_keys(tile, ctx)
            if valid < KEYS_PER_TILE:
                v[max(valid, 0):] = 0.0
        new_max = np.maximum(row_max, s.max(1))
        max_scaled = np.where(new_max == -np.inf, 0.0, new_max * scale_log2)
        p = np.exp2(s * scale_log2 - max_scaled[:, None])
        correction = np.exp2(row_max * scale_log2 - max_scaled)
        row_sum = row_sum * correction + p.sum(1)
        acc = acc * correction[:, None] + p @ v
        row_max = new_max
    with np.errstate(divide="ignore"):
        inv = np.where(row_sum > 0, 1.0 / np.where(row_sum > 0, row_sum, 1.0), 0.0)
        lse = np.where(row_sum > 0, (row_max * scale_log2 + np.log2(row_sum)) / decode_schedule.LOG2_E, -np.inf)
    keep = token < q_len
    return keep, token, head, acc * inv[:, None], lse


def _merge(o_part: np.ndarray, lse_part: np.ndarray, sched) -> tuple[np.ndarray, np.ndarray]:
    """decode_merge's warp per (row, head): weights exp2((LSE_s - top) log2 e) of the non-empty splits."""
    tokens, heads = lse_part.shape[1:]
    out, lse = np.zeros(o_part.shape[1:]), np.full((tokens, heads), -np.inf)
    for pair in range(tokens * heads):
        row, head = sched.merge_pair(pair, heads)
        lse_s = lse_part[:, row, head]
        top = lse_s.max()
        weight = np.array([sched.split_weight(x, top, np.exp2) if x > -np.inf else 0.0 for x in lse_s])
        total = weight.sum()
        inv = 1.0 / total if total > 0 else 0.0
        for s, w in enumerate(weight * inv):
            if w > 0:  # empty splits' partials may be anything
                out[row, head] += w * o_part[s, row, head]
        if total > 0:
            lse[row, head] = sched.merged_lse(top, total, np.log2)
    return out, lse


def emulate(args: DecodeArgs, splits: int, sched=decode_schedule) -> tuple[np.ndarray, np.ndarray]:
    """(O [tokens, H, d], LSE [tokens, H]) as the kernel (and with splits > 1 the merge) writes them."""
    q, kc, vc = (t.double().numpy() for t in (args.q, args.k_cache, args.v_cache))
    tables, lens = args.block_tables.numpy(), args.context_lens.tolist()
    cu = args.cu_seqlens_q.tolist() if args.cu_seqlens_q is not None else list(range(len(lens) + 1))
    tokens, heads, d = q.shape
    group = heads // kc.shape[2]
    o_part, lse_part = np.full((splits, tokens, heads, d), np.nan), np.full((splits, tokens, heads), np.nan)
    for b, ctx in enumerate(lens):
        for kv_head in range(kc.shape[2]):
            for split in range(splits):
                keep, token, head, o, lse = _cta(q, kc, vc, tables[b], ctx, cu[b], cu[b + 1] - cu[b], kv_head, group,
                                                 split, splits, args.scale * math.log2(math.e), sched)
                o_part[split, cu[b] + token[keep], head[keep]] = o[keep]
                lse_part[split, cu[b] + token[keep], head[keep]] = lse[keep]
    if splits == 1:
        return o_part[0], lse_part[0]
    return _merge(o_part, lse_part, sched)


def reference_lse(args: DecodeArgs) -> np.ndarray:
    """Natural-log sum of exp(scale q.k) over each query's visible keys, by plain gathers."""
    q, kc = args.q.double().numpy(), args.k_cache.double().numpy()
    tables, lens = args.block_tables.numpy(), args.context_lens.tolist()
    cu = args.cu_seqlens_q.tolist() if args.cu_seqlens_q is not None else list(range(len(lens) + 1))
    group = q.shape[1] // kc.shape[2]
    out = np.zeros(q.shape[:2])
    for b, ctx in enumerate(lens):
        pos = np.arange(ctx)
        keys = kc[tables[b][pos // BLOCK], pos % BLOCK]  # [ctx, Hkv, d]
        q_len = cu[b + 1] - cu[b]
        for t in range(q_len):
            visible = keys[: ctx - q_len + t + 1].repeat(group, axis=1)
            s = np.einsum("hd,khd->hk", q[cu[b] + t], visible) * args.scale
            top = s.max(1, keepdims=True)
            out[cu[b] + t] = (top + np.log(np.exp(s - top).sum(1, keepdims=True)))[:, 0]
    return out


CASES = {  # name: (context lengths, query tokens per sequence, heads, kv heads, d)
    "decode": ([1, 17, 64, 65, 200, 1100], [1] * 6, 8, 2, 16),
    "verify": ([5, 64, 130, 700], [3, 1, 4, 2], 6, 2, 8),
    "wide group": ([33, 300], [8, 2], 16, 2, 8),
}


@pytest.mark.parametrize("splits", [1, 3, 32])
@pytest.mark.parametrize("name", CASES)
def test_emulation_matches_the_reference(name, splits):
    """32 splits leave most splits of every sequence here empty; the merge must skip them."""
    args = make_case(*CASES[name], seed=len(name) + splits)
    out, lse = emulate(args, splits)
    ref = reference_out(args)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, reference_lse(args), rtol=0, atol=1e-9)


def test_cases_hold_empty_splits_and_refills():
    spans = [decode_schedule.split_tiles(s, 32, ctx) for ctx in CASES["decode"][0] for s in range(32)]
    assert any(n == 0 for _, n in spans) and max(n for _, n in spans) >= 1
    assert decode_schedule.split_tiles(0, 1, 1100)[1] > 2 * decode_schedule.TILES_PER_GROUP  # two table refills


def test_the_kernels_split_is_the_specs_range():
    for ctx in (1, 63, 64, 65, 1000, 4097):
        for splits in (1, 2, 3, 7, 32):
            for s in range(splits):
                lo, n = decode_schedule.split_tiles(s, splits, ctx)
                assert (lo, lo + n) == split_tile_range(s, splits, ctx)


def broken(**changes) -> types.SimpleNamespace:
    ns = types.SimpleNamespace(**{k: getattr(decode_schedule, k) for k in dir(decode_schedule) if k[0] != "_"})
    for name, fn in changes.items():
        assert hasattr(ns, name)
        setattr(ns, name, fn)
    return ns


def _split_rounded_down(split, splits, ctx, imin=min):
    """split_tiles with per_split = tiles // splits (at least 1): the last tiles belong to no split."""
    tiles = -(-ctx // KEYS_PER_TILE)
    per = max(tiles // splits, 1)
    lo = imin(split * per, tiles)
    return lo, imin(lo + per, tiles) - lo


BROKEN = {
    "clamp to one column short": dict(table_column=lambda lo, g, lane, last, imin=min: imin(
        lo * BLOCKS_PER_TILE + g * 32 + lane, last - 1) if last else 0),
    "split runs rounded down": dict(split_tiles=_split_rounded_down),
    "merge weights in natural exp of log2 units": dict(split_weight=lambda lse, top, exp2: exp2(lse - top)),
    "merged LSE without the log2 e": dict(merged_lse=lambda top, total, log2: top + log2(total)),
    "causal limit one key late": dict(key_limit=lambda tok, tile, ctx, q_len: ctx - q_len + tok + 2 - tile * 64),
    "V tail zeroed one row late": dict(tile_valid_keys=lambda tile, ctx: ctx - tile * 64 + 1),
    "wrong shuffle lane": dict(block_lane=lambda i, j: (i % 8) * 4 + (j + 1) % 4),
}


@pytest.mark.parametrize("name", BROKEN)
def test_emulation_fails_on_a_broken_schedule(name):
    args = make_case(*CASES["verify"], seed=5)
    out, lse = emulate(args, 3, broken(**BROKEN[name]))
    ok = (np.isfinite(out).all() and np.allclose(out, reference_out(args), rtol=1e-4, atol=1e-5)
          and np.allclose(lse, reference_lse(args), atol=1e-9))
    assert not ok, f"{name}: the emulation still matches the reference"


def test_an_unclamped_column_reads_outside_the_table():
    """Without the clamp the producer's lanes read the next group's columns past the row's end."""
    args = make_case(*CASES["decode"], seed=1)
    with pytest.raises(IndexError, match="outside a row"):
        emulate(args, 1, broken(table_column=lambda lo, g, lane, last, imin=min: lo * BLOCKS_PER_TILE + g * 32 + lane))
