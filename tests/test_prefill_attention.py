"""Prefill attention: CPU tests of the kernel's index arithmetic and host preparation, and GPU
numerics (skipped without an sm_90 GPU) against the fp32 torch reference."""
from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.hopper.prefill_host import prepare_prefill_args
from cute_kernels.hopper.prefill_schedule import (
    ceil_div, key_row_coords, kv_block_range, packed_row_token_head, query_key_position,
)
from cute_kernels.hopper.prefill_spec import KV_BLOCK_SIZE, TileConfig
from cute_kernels.reference import prefill_attention_ref


def make_batch(q_lens, prefix_lens, heads, kv_heads, d, dtype=torch.float32, device="cpu", seed=0):
    """Packed q/k/v for new tokens (k_len == q_len) plus a shuffled paged cache holding each prefix."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    total = sum(q_lens)
    q, k, v = rnd(total, heads, d), rnd(total, kv_heads, d), rnd(total, kv_heads, d)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=device)
    blocks_per_seq = [max(1, ceil_div(p, KV_BLOCK_SIZE)) for p in prefix_lens]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)  # blocks scattered through the pool
    tables = torch.zeros(len(q_lens), max(blocks_per_seq) + 2, dtype=torch.int32)
    start = 0
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = perm[start:start + n]
        start += n
    k_cache, v_cache = rnd(num_blocks, KV_BLOCK_SIZE, kv_heads, d), rnd(num_blocks, KV_BLOCK_SIZE, kv_heads, d)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), k_cache=k_cache, v_cache=v_cache,
                block_tables=tables.to(device), prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32, device=device))


def emulate_kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, k_cache, v_cache, block_tables,
                   prefix_lens, tile=TileConfig.for_head_dim(128)):
    """The kernel's algorithm in torch, CTA by CTA, with the kernel's own index functions: packed GQA
    rows, clamped key-row gather (cache or new rows), key tiles from n_block_max-1 down, masking only
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
            for m_block in range(ceil_div(q_len * group, tile.tile_m)):
                rows = torch.arange(m_block * tile.tile_m, (m_block + 1) * tile.tile_m)
                tokens, qheads = packed_row_token_head(rows, kv_head, group)
                tokens_c = tokens.clamp(max=q_len - 1)
                qt = q[q_start + tokens_c, qheads].float()  # [tile_m, d]
                n_max, n_mask_start = kv_block_range(m_block, q_len, seqlen_k, group, tile.tile_m, tile.tile_n, causal)
                n_mask_start = max(n_mask_start, 0)
                row_limit = torch.full((tile.tile_m,), seqlen_k)
                if causal:
                    row_limit = torch.minimum(query_key_position(tokens, q_len, seqlen_k) + 1, row_limit)
                valid_rows = tokens < q_len
                for n in range(n_max, ceil_div(seqlen_k, tile.tile_n)):  # skipped tiles: fully masked
                    assert (n * tile.tile_n >= row_limit[valid_rows]).all(), (b, m_block, n)
                m = torch.full((tile.tile_m,), -math.inf)
                s_sum = torch.zeros(tile.tile_m)
                acc = torch.zeros(tile.tile_m, d)
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


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_lens,prefix_lens,heads,kv_heads", GRID)
def test_kernel_schedule_matches_reference(q_lens, prefix_lens, heads, kv_heads, causal):
    batch = make_batch(q_lens, prefix_lens, heads, kv_heads, d=16)
    scale = 16 ** -0.5
    has_prefix = any(prefix_lens)
    kw = {} if has_prefix else dict(k_cache=None, v_cache=None, block_tables=None, prefix_lens=None)
    args = {**batch, **kw}
    ref = prefill_attention_ref(PrefillArgs(scale=scale, causal=causal, **args))
    emu = emulate_kernel(scale=scale, causal=causal, **batch) if has_prefix else emulate_kernel(
        scale=scale, causal=causal, **{**batch, "prefix_lens": torch.zeros(len(q_lens), dtype=torch.int32)})
    assert not emu.isnan().any(), "kernel emulation left output rows unwritten"
    torch.testing.assert_close(emu, ref, rtol=1e-4, atol=1e-4)


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
    assert args.grid == (1, 2, 2)  # ceil(7 * 4 / 128) query tiles, 2 KV heads, 2 sequences
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
    """With the step's plan (block ids checked once) and max_seqlen_q, preparing a layer reads no
    tensor value on the host (no int()/item()/bool() of a tensor: each is a device sync on a GPU)."""
    from cute_kernels.hopper.prefill_host import plan_prefill

    x = make_batch([4, 9], [20, 40], 4, 2, d=64, dtype=torch.bfloat16)
    plan = plan_prefill(x["cu_seqlens_q"], x["cu_seqlens_k"], x["prefix_lens"], x["block_tables"],
                        x["k_cache"].shape[0])

    def sync(*_):
        raise AssertionError("host read of a tensor value (a device sync per layer)")

    for name in ("__int__", "__bool__", "__index__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    args = prepare_prefill_args(_prefix_args(x, max_seqlen_q=9, plan=plan))
    assert args.max_seqlen_q == 9 and args.block_tables is plan.block_tables
    with pytest.raises(AssertionError, match="device sync"):  # without max_seqlen_q it must sync
        prepare_prefill_args(_prefix_args(x, plan=plan))


def test_cute_backend_plans_and_checks_once_per_step():
    from runtime.model.attention_batch import AttentionBatch
    from runtime.model.cute_backend import CuteBackend

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
    from runtime.model.cute_backend import CuteBackend, CuteBackendUnavailable

    x = make_batch([4], [0], 4, 4, d=64, dtype=torch.bfloat16)
    with pytest.raises(CuteBackendUnavailable, match="unavailable"):
        CuteBackend().prefill(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], 0.125))


# ---------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
LENGTH_MIX = [1, 17, 128, 1000, 4096]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("with_prefix", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (32, 8), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_numerics_gpu(heads, kv_heads, head_dim, with_prefix, dtype):
    from cute_kernels.hopper.prefill_launch import launch_prefill

    prefixes = [0, 33, 16, 0, 700] if with_prefix else [0] * len(LENGTH_MIX)
    x = make_batch(LENGTH_MIX, prefixes, heads, kv_heads, head_dim, dtype=dtype, device="cuda")
    scale = head_dim ** -0.5
    cache_kw = dict(k_cache=x["k_cache"], v_cache=x["v_cache"], block_tables=x["block_tables"],
                    prefix_lens=x["prefix_lens"]) if with_prefix else {}
    args = prepare_prefill_args(PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], scale, True,
                                            **cache_kw))
    args.out.fill_(float("nan"))  # poisoned: unwritten elements fail
    args.lse.fill_(float("nan"))
    launch_prefill(args)
    torch.cuda.synchronize()
    f32 = {k: (t.float() if t.is_floating_point() else t) for k, t in x.items()}
    if not with_prefix:
        f32.update(k_cache=None, v_cache=None, block_tables=None, prefix_lens=None)
    ref = prefill_attention_ref(PrefillArgs(scale=scale, causal=True, **f32))
    assert not args.out.isnan().any() and not args.lse.isnan().any()
    rel = (args.out.float() - ref).norm() / ref.norm()
    assert rel <= 1e-2, f"relative error {rel:.2e}"
