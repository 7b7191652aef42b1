"""Prefill attention: CPU tests of the kernel's index arithmetic and host preparation, and GPU
numerics (skipped without an sm_90 GPU) against the fp32 torch reference."""
from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.hopper.prefill.prefill_host import prepare_prefill_args
from cute_kernels.hopper.prefill.prefill_schedule import (
    ceil_div,
    key_row_coords,
    kv_block_range,
    packed_row_token_head,
    query_key_position,
    tile_tokens,
)
from cute_kernels.hopper.prefill.prefill_spec import KV_BLOCK_SIZE, TileConfig
from cute_kernels.reference import prefill_attention_ref


def make_batch(q_lens, prefix_lens, heads, kv_heads, d, dtype=torch.float32, device="cpu", seed=0, k_lens=None):
    """Packed q/k/v for new tokens (k_lens new keys per sequence, default q_lens) plus a shuffled paged
    cache holding each prefix."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    k_lens = q_lens if k_lens is None else k_lens
    q = rnd(sum(q_lens), heads, d)
    k, v = rnd(sum(k_lens), kv_heads, d), rnd(sum(k_lens), kv_heads, d)

    def offsets(lens):
        return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    blocks_per_seq = [max(1, ceil_div(p, KV_BLOCK_SIZE)) for p in prefix_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)  # blocks scattered through the pool
    tables = torch.zeros(len(q_lens), max(blocks_per_seq) + 2, dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[start:start + n]
        start += n
    k_cache, v_cache = rnd(num_blocks, KV_BLOCK_SIZE, kv_heads, d), rnd(num_blocks, KV_BLOCK_SIZE, kv_heads, d)
    return dict(q=q, k=k, v=v, cu_seqlens_q=offsets(q_lens), cu_seqlens_k=offsets(k_lens), k_cache=k_cache, v_cache=v_cache,
                block_tables=tables.to(device), prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=device))


def emulate_kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, k_cache, v_cache, block_tables,
                   prefix_lens, tile=TileConfig.for_head_dim(128)):
    """The kernel's algorithm in torch, CTA by CTA, with the kernel's own index functions: packed GQA
    rows of whole tokens per tile, clamped key-row gather (cache or new rows), key tiles from n_block_max-1 down, masking only
    in tiles >= n_mask_start, online softmax. Asserts the schedule never skips or leaves unmasked a
    tile that needs it."""
    heads, d = q.shape[1], q.shape[2]
    kv_heads = k.shape[1]
    group = heads // kv_heads
    out = torch.full_like(q, float("nan"))
    for b in range(cu_seqlens_q.numel() - 1):
        q_start, q_len = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1] - cu_seqlens_q[b])
        k_start = int(cu_seqlens_k[b])
        prefix = int(prefix_lens[b])
        seqlen_k = prefix + int(cu_seqlens_k[b + 1]) - k_start
        for kv_head in range(kv_heads):
            tile_rows = tile_tokens(tile.tile_m, group) * group
            for m_block in range(ceil_div(q_len, tile_tokens(tile.tile_m, group))):
                rows = torch.arange(m_block * tile_rows, (m_block + 1) * tile_rows)
                tokens, qheads = packed_row_token_head(rows, kv_head, group)
                tokens_c = tokens.clamp(max=q_len - 1)
                qt = q[q_start + tokens_c, qheads].float()  # [tile_rows, d]
                n_max, n_mask_start = kv_block_range(m_block, q_len, seqlen_k, group, tile_rows, tile.tile_n, causal)
                n_mask_start = max(n_mask_start, 0)
                row_limit = torch.full((tile_rows,), seqlen_k)
                if causal:
                    row_limit = torch.minimum(query_key_position(tokens, q_len, seqlen_k) + 1, row_limit)
                valid_rows = tokens < q_len
                for n in range(n_max, ceil_div(seqlen_k, tile.tile_n)):  # skipped tiles: fully masked
                    assert (n * tile.tile_n >= row_limit[valid_rows]).all(), (b, m_block, n)
                m = torch.full((tile_rows,), -math.inf)
                s_sum = torch.zeros(tile_rows)
                acc = torch.zeros(tile_rows, d)
                for n in reversed(range(n_max)):
                    pos = (n * tile.tile_n + torch.arange(tile.tile_n)).clamp(max=seqlen_k - 1)
                    block_col, slot, new_row = key_row_coords(pos, prefix, k_start, KV_BLOCK_SIZE)
                    in_prefix = pos < prefix
                    cache_rows = block_tables[b].long()[block_col.clamp(max=block_tables.shape[1] - 1)]
                    kt = torch.where(in_prefix[:, None], k_cache[cache_rows, slot, kv_head],
                                     k[new_row.clamp(min=0, max=k.shape[0] - 1), kv_head]).float()
                    vt = torch.where(in_prefix[:, None], v_cache[cache_rows, slot, kv_head],
                                     v[new_row.clamp(min=0, max=v.shape[0] - 1), kv_head]).float()
                    s = qt @ kt.T
                    cols = n * tile.tile_n + torch.arange(tile.tile_n)
                    mask = cols[None, :] >= row_limit[:, None]
                    if n >= n_mask_start:
                        s = s.masked_fill(mask, -math.inf)
                    else:
                        assert not mask[valid_rows].any(), ("unmasked tile needs a mask", b, m_block, n)
                    new_m = torch.maximum(m, s.max(1).values)
                    safe = torch.where(new_m == -math.inf, 0.0, new_m * scale)
                    p = torch.exp(s * scale - safe[:, None])
                    corr = torch.exp(m * scale - safe)
                    s_sum = s_sum * corr + p.sum(1)
                    acc = acc * corr[:, None] + p @ vt
                    m = new_m
                o = acc / s_sum[:, None]
                out[q_start + tokens[valid_rows], qheads[valid_rows]] = o[valid_rows].to(out.dtype)
    return out


GRID = [
    # q_lens, prefix_lens, heads, kv_heads
    ([1, 17, 128], [0, 0, 0], 4, 4),
    ([130, 5], [0, 0], 9, 3),
    ([17, 1, 200], [40, 16, 129], 8, 2),
    ([64, 3], [300, 7], 8, 1),
    ([1], [33], 32, 8),
]


@pytest.mark.parametrize("tile_for_d", [128, 64])  # 128x128 tiles, and 192x128 (d 64)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_lens,prefix_lens,heads,kv_heads", GRID)
def test_kernel_schedule_matches_reference(q_lens, prefix_lens, heads, kv_heads, causal, tile_for_d):
    batch = make_batch(q_lens, prefix_lens, heads, kv_heads, d=16)
    scale = 16 ** -0.5
    has_prefix = any(prefix_lens)
    kw = {} if has_prefix else dict(k_cache=None, v_cache=None, block_tables=None, prefix_lens=None)
    args = {**batch, **kw}
    ref = prefill_attention_ref(PrefillArgs(scale=scale, causal=causal, **args))
    tile = TileConfig.for_head_dim(tile_for_d)
    emu = emulate_kernel(scale=scale, causal=causal, tile=tile, **batch) if has_prefix else emulate_kernel(
        scale=scale, causal=causal, tile=tile, **{**batch, "prefix_lens": torch.zeros(len(q_lens), dtype=torch.int32)})
    assert not emu.isnan().any(), "kernel emulation left output rows unwritten"
    torch.testing.assert_close(emu, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_kernel_schedule_with_more_new_keys_than_queries(causal):
    """k_len != q_len (e.g. a chunk re-reading keys it did not query): bottom-right alignment holds."""
    batch = make_batch([5, 64, 130], [0, 20, 300], 8, 2, d=16, k_lens=[9, 64, 200])
    ref = prefill_attention_ref(PrefillArgs(scale=0.25, causal=causal, **batch))
    emu = emulate_kernel(scale=0.25, causal=causal, **batch)
    torch.testing.assert_close(emu, ref, rtol=1e-4, atol=1e-4)


def test_lse_reference_normalizes_the_reference_output():
    """prefill_lse_ref is the log of each row's softmax denominator: exp(s - lse) @ v rebuilds the output."""
    from cute_kernels.reference import gather_paged, prefill_lse_ref

    x = make_batch([3, 40], [0, 20], 8, 2, d=16, k_lens=[3, 44])
    for causal in (True, False):
        args = PrefillArgs(scale=0.25, causal=causal, **x)
        out, lse = prefill_attention_ref(args), prefill_lse_ref(args, chunk=7)
        keys = torch.cat([gather_paged(x["k_cache"], x["block_tables"][1], 20), x["k"][3:]])[:, 1]
        values = torch.cat([gather_paged(x["v_cache"], x["block_tables"][1], 20), x["v"][3:]])[:, 1]
        row, head, visible = 3 + 10, 5, (20 + 4 + 10 + 1) if causal else 64  # sequence 1, token 10, KV head 1
        p = torch.exp(keys[:visible] @ x["q"][row, head] * 0.25 - lse[row, head])
        torch.testing.assert_close(p @ values[:visible], out[row, head], rtol=1e-5, atol=1e-5)


def test_packed_rows_cover_each_query_head_once():
    group, kv_heads, q_len = 3, 2, 5
    seen = set()
    for kv_head in range(kv_heads):
        for row in range(q_len * group):
            seen.add(packed_row_token_head(row, kv_head, group))
    assert seen == {(t, h) for t in range(q_len) for h in range(group * kv_heads)}


def test_causal_tiles_skip_the_future():
    # 256 queries over 256 keys, no prefix: the first query tile (rows 0..127) needs key tile 0 only.
    assert kv_block_range(0, 256, 256, 1, 128, 128, True) == (1, 0)
    assert kv_block_range(1, 256, 256, 1, 128, 128, True) == (2, 1)
    # A prefix of 300 shifts the diagonal: every new query sees all 300 prefix keys unmasked.
    n_max, n_mask_start = kv_block_range(0, 128, 428, 1, 128, 128, True)
    assert (n_max, n_mask_start) == (4, 2)
    # Non-causal: only the ragged last tile is masked.
    assert kv_block_range(0, 10, 300, 1, 128, 128, False) == (3, 2)


def test_prepare_args_without_prefix():
    batch = make_batch([3, 7], [0, 0], 8, 2, d=128, dtype=torch.bfloat16)
    args = prepare_prefill_args(PrefillArgs(batch["q"], batch["k"], batch["v"], batch["cu_seqlens_q"].long(),
                                            batch["cu_seqlens_k"].long(), 0.1))
    assert args.spec.qheads_per_kvhead == 4 and args.spec.head_dim == 128 and args.spec.dtype == "bfloat16"
    assert args.max_seqlen_q == 7
    # ceil(7 / 32) query tiles of 32 tokens x 4 heads, 2 KV heads, 2 sequences: 4 tiles, 4 persistent CTAs
    assert args.tile_order.dtype == torch.int32 and sorted(args.tile_order.tolist()) == [0, 1, 2, 3]
    assert args.num_ctas == 4 and args.kernel_tensors()[-3] is args.tile_order  # then the e4m3 scales
    assert args.prefix_lens.tolist() == [0, 0] and args.prefix_lens.dtype == torch.int32
    assert args.cu_seqlens_q.dtype == torch.int32 and args.block_tables.shape == (2, 1)
    assert args.k_cache.shape == (1, KV_BLOCK_SIZE, 2, 128)
    assert args.lse.shape == (10, 8) and args.lse.dtype == torch.float32
    assert math.isclose(args.softmax_scale_log2, 0.1 * math.log2(math.e))


def test_prepare_args_spec_ignores_runtime_sizes():
    """Batches of other lengths, head counts and cache sizes share one compile key."""
    a = make_batch([3, 7], [5, 0], 8, 2, d=64, dtype=torch.float16)
    b = make_batch([100], [40], 16, 4, d=64, dtype=torch.float16)
    specs = {prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.1, True,
                                              x["k_cache"], x["v_cache"], x["block_tables"], x["prefix_lens"])).spec
             for x in (a, b)}
    assert len(specs) == 1


def test_prepare_args_rejects_bad_inputs():
    x = make_batch([4], [0], 6, 4, d=64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query heads"):
        prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.1))
    y = make_batch([4], [3], 4, 4, d=64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="needs k_cache"):
        prepare_prefill_args(PrefillArgs(y["q"], y["k"], y["v"], y["cu_seqlens_q"], y["cu_seqlens_k"], 0.1,
                                         prefix_lens=y["prefix_lens"]))
    with pytest.raises(ValueError, match="head_dim 96"):
        z = make_batch([4], [0], 4, 4, d=96, dtype=torch.bfloat16)
        prepare_prefill_args(PrefillArgs(z["q"], z["k"], z["v"], z["cu_seqlens_q"], z["cu_seqlens_k"], 0.1))


def _prefix_args(x, **kw) -> PrefillArgs:
    return PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.1, True, x["k_cache"],
                       x["v_cache"], x["block_tables"], x["prefix_lens"], **kw)


@pytest.mark.parametrize("bad", ["id_past_cache", "negative_id", "prefix_past_table"])
def test_prepare_args_rejects_block_ids_outside_the_cache(bad):
    """The kernel follows block ids through raw addresses: a bad table must be a ValueError."""
    x = make_batch([4, 9], [20, 40], 4, 2, d=64, dtype=torch.bfloat16)
    num_blocks = x["k_cache"].shape[0]
    if bad == "id_past_cache":
        x["block_tables"][1, 2] = num_blocks
    elif bad == "negative_id":
        x["block_tables"][0, 0] = -1
    else:
        x["prefix_lens"][1] = x["block_tables"].shape[1] * KV_BLOCK_SIZE + 1
    with pytest.raises(ValueError, match="out of range"):
        prepare_prefill_args(_prefix_args(x))


def test_step_plan_spares_every_layer_a_device_sync(monkeypatch):
    """With the step's plan (block ids and lengths checked once) and max_seqlen_q, preparing a layer reads
    no tensor value on the host (no int()/item()/bool() of a tensor: each is a device sync on a GPU)."""
    from cute_kernels.hopper.prefill.prefill_host import plan_prefill

    x = make_batch([4, 9], [20, 40], 4, 2, d=64, dtype=torch.bfloat16)
    plan = plan_prefill(x["prefix_lens"], x["block_tables"], x["k_cache"].shape[0], x["cu_seqlens_q"],
                        x["cu_seqlens_k"])

    def sync(*_):
        raise AssertionError("host read of a tensor value (a device sync per layer)")

    for name in ("__int__", "__bool__", "__index__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    args = prepare_prefill_args(_prefix_args(x, max_seqlen_q=9, plan=plan))
    assert args.max_seqlen_q == 9 and args.block_tables is plan.block_tables
    again = prepare_prefill_args(_prefix_args(x, max_seqlen_q=9, plan=plan))
    assert again.tile_order is args.tile_order  # the tile list: built once per step, shared by every layer
    with pytest.raises(AssertionError, match="device sync"):  # without max_seqlen_q it must sync
        prepare_prefill_args(_prefix_args(x, plan=plan))


def test_cute_backend_plans_and_checks_once_per_step():
    from runtime.accel.cute_backend import CuteBackend
    from runtime.model.attention_batch import AttentionBatch

    x = make_batch([4, 9], [20, 40], 4, 2, d=64)
    num_blocks = x["k_cache"].shape[0]
    batch = AttentionBatch(slot_mapping=torch.zeros(13, dtype=torch.long), num_blocks=num_blocks,
                           block_size=KV_BLOCK_SIZE, cu_seqlens_q=x["cu_seqlens_q"],
                           prefill_prefix_lens=x["prefix_lens"], prefill_block_tables=x["block_tables"],
                           max_prefix_len=40, max_seqlen_q=9)
    CuteBackend().plan(batch)
    assert batch.prefill_plan.num_blocks == num_blocks
    assert batch.prefill_args(x["q"], x["k"], x["v"], x["k_cache"], x["v_cache"], 0.1).plan is batch.prefill_plan
    batch.prefill_plan, batch.prefill_block_tables[0, 1] = None, num_blocks + 5
    with pytest.raises(ValueError, match="out of range"):
        CuteBackend().plan(batch)


def test_cute_backend_refuses_cpu_tensors_clearly():
    from runtime.accel.cute_backend import CuteBackend, CuteBackendUnavailable

    x = make_batch([4], [0], 4, 4, d=64, dtype=torch.bfloat16)
    with pytest.raises(CuteBackendUnavailable, match="unavailable"):
        CuteBackend().prefill(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.125))


# ---------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
# Ragged tails around the 128-row / 128-key tiles, and prefixes that start mid-block and mid-tile.
LENGTH_MIX = [1, 17, 127, 128, 129, 1000, 2049]
PREFIX_MIX = [0, 33, 16, 0, 700, 5, 129]
HEAD_MIX = [(4, 4), (9, 3), (32, 8), (8, 1)]  # group 1, 3, 4, 8: the runtime's variants


def run_kernel(x: dict, scale: float, causal: bool, with_prefix: bool, num_ctas: int | None = None):
    """Launch through the path this process uses (JIT or AOT) on NaN-poisoned outputs; num_ctas
    shrinks the persistent grid (default: one CTA per SM)."""
    from cute_kernels.hopper.prefill.prefill_launch import launch_prefill

    cache_kw = dict(k_cache=x["k_cache"], v_cache=x["v_cache"], block_tables=x["block_tables"],
                    prefix_lens=x["prefix_lens"]) if with_prefix else {}
    args = prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], scale,
                                            causal, **cache_kw))
    args.out.fill_(float("nan"))  # poisoned: unwritten elements fail
    args.lse.fill_(float("nan"))
    if num_ctas is not None:
        args.num_ctas = num_ctas
    launch_prefill(args)
    torch.cuda.synchronize()
    return args.out, args.lse


def assert_matches_reference(x: dict, out, lse, scale: float, causal: bool, with_prefix: bool):
    """Per (sequence, head): the kernel's max |error| against the fp32 reference is at most twice that
    of the same reference run in the input dtype, plus one output ulp (the kernel rounds P to 16 bits
    before P @ V, as FlashAttention does); LSE within 2e-3 of the fp32 LSE (both from the same
    16-bit inputs with fp32 accumulation: only summation order and exp2 approximation differ)."""
    from cute_kernels.reference import prefill_lse_ref

    drop = {} if with_prefix else dict(k_cache=None, v_cache=None, block_tables=None, prefix_lens=None)
    f32 = PrefillArgs(scale=scale, causal=causal, **{k: (t.float() if t.is_floating_point() else t)
                                                     for k, t in {**x, **drop}.items()})
    ref = prefill_attention_ref(f32)
    low = prefill_attention_ref(PrefillArgs(scale=scale, causal=causal, **{**x, **drop})).float()
    ref_lse = prefill_lse_ref(f32)
    assert not out.isnan().any() and not lse.isnan().any(), "rows left unwritten"
    ulp = 2.0 ** -8 if out.dtype == torch.bfloat16 else 2.0 ** -11
    cu = x["cu_seqlens_q"].tolist()
    for b in range(len(cu) - 1):
        rows = slice(cu[b], cu[b + 1])
        err = (out[rows].float() - ref[rows]).abs().amax(dim=(0, 2))  # [heads]
        bound = 2 * (low[rows] - ref[rows]).abs().amax(dim=(0, 2)) + ulp
        bad = (err > bound).nonzero().flatten().tolist()
        assert not bad, f"sequence {b} (len {cu[b + 1] - cu[b]}), heads {bad}: error {err[bad]} > {bound[bad]}"
        lse_err = (lse[rows] - ref_lse[rows]).abs().amax(dim=0)
        assert (lse_err <= 2e-3).all(), f"sequence {b}: LSE error {lse_err.max():.2e} (head {int(lse_err.argmax())})"


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("with_prefix", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", HEAD_MIX)
def test_prefill_numerics_gpu(heads, kv_heads, head_dim, causal, with_prefix):
    prefixes = PREFIX_MIX if with_prefix else [0] * len(LENGTH_MIX)
    x = make_batch(LENGTH_MIX, prefixes, heads, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    out, lse = run_kernel(x, head_dim ** -0.5, causal, with_prefix)
    assert_matches_reference(x, out, lse, head_dim ** -0.5, causal, with_prefix)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_numerics_fp16_gpu(head_dim):
    x = make_batch(LENGTH_MIX, PREFIX_MIX, 32, 8, head_dim, dtype=torch.float16, device="cuda", seed=1)
    out, lse = run_kernel(x, head_dim ** -0.5, True, True)
    assert_matches_reference(x, out, lse, head_dim ** -0.5, True, True)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_more_new_keys_than_queries_gpu(causal):
    """k_len != q_len with paged prefixes: queries bottom-right aligned over [prefix ; new keys]."""
    x = make_batch([5, 64, 300, 1], [0, 20, 129, 700], 32, 8, 128, dtype=torch.bfloat16, device="cuda",
                   k_lens=[9, 64, 812, 130])
    out, lse = run_kernel(x, 128 ** -0.5, causal, True)
    assert_matches_reference(x, out, lse, 128 ** -0.5, causal, True)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", HEAD_MIX)
def test_prefill_tma_store_beside_ragged_tiles_gpu(heads, kv_heads, head_dim):
    """Sequences of exactly 1 and 2 tiles (TMA-store epilogue only) packed between ragged ones (a last
    tile stored per thread): a box landing on the wrong tokens or heads, or a ragged tile stored by
    TMA over its neighbour's rows, shows as an error or an unwritten (NaN) row."""
    tokens = tile_tokens(TileConfig.for_head_dim(head_dim).tile_m, heads // kv_heads)
    lens = [2 * tokens, tokens + 1, tokens, 1, tokens - 1, 2 * tokens]
    x = make_batch(lens, [0, 40, 0, 3, 17, 0], heads, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda",
                   seed=3)
    out, lse = run_kernel(x, head_dim ** -0.5, True, True)
    assert_matches_reference(x, out, lse, head_dim ** -0.5, True, True)


@pytest.mark.gpu
@gpu
def test_prefill_long_sequences_gpu():
    """8192 queries (64 key tiles deep: every pipeline stage wraps many times), a ragged 4097 over a
    paged prefix, and one token over 8000 cached keys."""
    x = make_batch([8192, 4097, 1], [0, 300, 8000], 32, 8, 128, dtype=torch.bfloat16, device="cuda", seed=2)
    out, lse = run_kernel(x, 128 ** -0.5, True, True)
    assert_matches_reference(x, out, lse, 128 ** -0.5, True, True)
