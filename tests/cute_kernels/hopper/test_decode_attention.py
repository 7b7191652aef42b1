"""Paged split-KV decode attention (cute_kernels/hopper/decode_*): CPU tests of the split heuristic,
the host's checks, the split reference and a tile-by-tile emulation of the kernel's algorithm; GPU
numerics (marker gpu, skipped without an sm_90 GPU) against the fp32 reference.

Tolerances: the GPU kernel takes bf16/fp16 inputs exactly (the reference runs on the same values in
fp32); its errors are P rounded to the input dtype before P @ V and the output's rounding, about
2^-8 relative for bf16, so 1e-2 relative (L2 per sequence and head) leaves room and still catches
any wrong key, row or split. LSEs are fp32 sums of fp32 exponentials: 1e-3 absolute.
"""
from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.cpu.decode_attention import decode_attention_cpu
from cute_kernels.hopper.decode.decode_host import decode_attention, plan_decode, prepare_decode_args
from cute_kernels.hopper.decode.decode_reference import decode_split_ref, merge_splits_ref
from cute_kernels.hopper.decode.decode_spec import (
    BLOCKS_PER_TILE,
    KEYS_PER_TILE,
    MAX_SPLITS,
    QUERY_ROWS,
    ceil_div,
    num_splits,
    split_tile_range,
)
from cute_kernels.hopper.prefill.prefill_spec import KV_BLOCK_SIZE
from cute_kernels.reference import decode_attention_ref


def decode_case(lens, heads, kv_heads, d, q_lens=None, dtype=torch.float32, device="cpu", seed=0, poison=True):
    """DecodeArgs over a shuffled cache: each sequence's blocks scattered through a pool with spare
    blocks, table columns past its length pointing anywhere, and (poison) NaN in every slot no
    sequence owns (spare blocks, the tail of each last block): the kernel must never let them in."""
    g = torch.Generator().manual_seed(seed)
    blocks = [ceil_div(n, KV_BLOCK_SIZE) for n in lens]
    width = max(blocks) + 2
    num_blocks = sum(blocks) + 5
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.randint(0, num_blocks, (len(lens), width), generator=g, dtype=torch.int32)
    cache = [torch.randn(num_blocks, KV_BLOCK_SIZE, kv_heads, d, generator=g) for _ in range(2)]
    owned = torch.zeros(num_blocks, KV_BLOCK_SIZE, dtype=torch.bool)
    start = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[start:start + n].int()
        start += n
        t = torch.arange(lens[b])
        owned[tables[b, t // KV_BLOCK_SIZE].long(), t % KV_BLOCK_SIZE] = True
    if poison:
        for c in cache:
            c[~owned] = float("nan")
    q_lens = q_lens or [1] * len(lens)
    q = torch.randn(sum(q_lens), heads, d, generator=g) * 1.5
    cu = None if all(n == 1 for n in q_lens) else torch.tensor([0, *torch.tensor(q_lens).cumsum(0)], dtype=torch.int32)
    to = lambda t: t.to(dtype=dtype, device=device) if t.is_floating_point() else t.to(device)  # noqa: E731
    return DecodeArgs(to(q), to(cache[0]), to(cache[1]), to(tables), to(torch.tensor(lens, dtype=torch.int32)),
                      d ** -0.5, cu_seqlens_q=None if cu is None else to(cu))


def emulate_kernel(args: DecodeArgs, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's algorithm in torch, CTA by CTA and tile by tile, with its own index rules: the
    split's tiles, table columns clamped to the last one of the context, 64 packed (token, head) rows
    with padding rows repeating the last token, the mask only in tiles reaching past
    context - q_len + 1, V rows past the context zeroed, online softmax. Returns the partials."""
    q, kc, vc = args.q.float(), args.k_cache.float(), args.v_cache.float()
    tokens, heads, d = q.shape
    kv_heads = kc.shape[2]
    group = heads // kv_heads
    cu = args.cu_seqlens_q.tolist() if args.cu_seqlens_q is not None else list(range(len(args.context_lens) + 1))
    o_part = torch.full((splits, tokens, heads, d), float("nan"))
    lse_part = torch.full((splits, tokens, heads), float("nan"))
    for b, ctx in enumerate(args.context_lens.tolist()):
        q_start, q_len = cu[b], cu[b + 1] - cu[b]
        rows = torch.arange(QUERY_ROWS)
        token = torch.clamp(rows // group, max=q_len - 1)
        last_col = (ctx - 1) // KV_BLOCK_SIZE
        for split in range(splits):
            lo, hi = split_tile_range(split, splits, ctx)
            for kv_head in range(kv_heads):
                head = kv_head * group + rows % group
                qt = q[q_start + token, head]
                m = torch.full((QUERY_ROWS,), -math.inf)
                s_sum = torch.zeros(QUERY_ROWS)
                acc = torch.zeros(QUERY_ROWS, d)
                for tile in range(lo, hi):
                    cols = [min(tile * BLOCKS_PER_TILE + j, last_col) for j in range(BLOCKS_PER_TILE)]
                    ids = args.block_tables[b, cols].long()
                    k = kc[ids, :, kv_head].reshape(KEYS_PER_TILE, d)
                    v = vc[ids, :, kv_head].reshape(KEYS_PER_TILE, d).clone()
                    s = qt @ k.T * args.scale
                    if (tile + 1) * KEYS_PER_TILE > ctx - q_len + 1:
                        limit = ctx - q_len + token + 1 - tile * KEYS_PER_TILE
                        s = torch.where(torch.arange(KEYS_PER_TILE)[None] >= limit[:, None], -math.inf, s)
                        v[max(ctx - tile * KEYS_PER_TILE, 0):] = 0.0
                    new_m = torch.maximum(m, s.max(1).values)
                    safe = torch.where(new_m == -math.inf, 0.0, new_m)
                    p = torch.exp(s - safe[:, None])
                    corr = torch.exp(m - safe)
                    s_sum, acc, m = s_sum * corr + p.sum(1), acc * corr[:, None] + p @ v, new_m
                real = rows < q_len * group
                inv = torch.where(s_sum > 0, 1 / s_sum, 0.0)
                lse = torch.where(s_sum > 0, m + torch.log(s_sum), -math.inf)
                o_part[split, q_start + token[real], head[real]] = (acc * inv[:, None])[real]
                lse_part[split, q_start + token[real], head[real]] = lse[real]
    return o_part, lse_part


# ---------------------------------------------------------------------------------------------- CPU
def test_split_heuristic():
    assert num_splits(64, 8, 4096) == 1  # 512 CTAs fill 132 SMs x 2
    assert num_splits(1, 8, 32768) == MAX_SPLITS  # one sequence: split as far as the merge allows
    assert num_splits(8, 1, 1000) == 4  # 16 tiles, at least 4 per split
    assert num_splits(1, 8, 100) == 1  # too short to be worth a merge
    assert num_splits(4, 8, 8192) == 9  # 32 CTAs: 9 splits make ~one wave of 264
    assert num_splits(0, 8, 100) == 1


@pytest.mark.parametrize("ctx", [1, 63, 64, 65, 1000, 32768])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 32])
def test_splits_cover_every_tile_once(ctx, splits):
    covered = []
    for s in range(splits):
        lo, hi = split_tile_range(s, splits, ctx)
        assert lo <= hi
        covered += range(lo, hi)
    assert covered == list(range(ceil_div(ctx, KEYS_PER_TILE)))


@pytest.mark.parametrize("q_lens", [None, [1, 3, 2, 4]])
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_emulation_matches_the_split_reference(q_lens, splits):
    """With NaN in every slot the sequences do not own, padded table columns, ragged lengths and
    verify queries: the kernel's algorithm gives the reference's partials and merged result."""
    args = decode_case([1, 17, 64, 200], heads=6, kv_heads=2, d=16, q_lens=q_lens)
    emu_o, emu_lse = emulate_kernel(args, splits)
    ref_o, ref_lse = decode_split_ref(args, splits)
    torch.testing.assert_close(emu_lse, ref_lse, rtol=1e-5, atol=1e-5)
    visible = ref_lse > -math.inf
    torch.testing.assert_close(emu_o[visible], ref_o[visible], rtol=1e-5, atol=1e-5)
    merged, _ = merge_splits_ref(emu_o, emu_lse)
    assert not merged.isnan().any()
    torch.testing.assert_close(merged, merge_splits_ref(ref_o, ref_lse)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_lens", [None, [2, 1, 4]])
def test_split_reference_merges_to_the_reference(q_lens):
    args = decode_case([5, 90, 333], heads=8, kv_heads=2, d=32, q_lens=q_lens, poison=False)
    full_o, full_lse = decode_split_ref(args, 1)
    o, lse = merge_splits_ref(*decode_split_ref(args, 4))
    want = decode_attention_ref(args)
    torch.testing.assert_close(full_o[0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, full_lse[0], rtol=1e-5, atol=1e-5)


def test_reference_matches_the_cpu_kernel():
    """The GPU tests' oracle agrees with the independent C decode kernel (fp32, one token each)."""
    args = decode_case([1, 15, 16, 17, 300], heads=9, kv_heads=3, d=64)
    o, _ = merge_splits_ref(*decode_split_ref(args, 2))
    torch.testing.assert_close(o, decode_attention_cpu(args), rtol=1e-5, atol=1e-5)


def test_verify_reference_with_one_token_each_is_decode():
    args = decode_case([3, 40], heads=4, kv_heads=4, d=16, poison=False)
    args.cu_seqlens_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    verify = decode_attention_ref(args)
    args.cu_seqlens_q = None
    torch.testing.assert_close(verify, decode_attention_ref(args), rtol=1e-5, atol=1e-5)


def test_prepare_args_shapes_and_placeholders():
    args = decode_case([20, 700], heads=8, kv_heads=2, d=128, dtype=torch.bfloat16)
    one = prepare_decode_args(args, splits=1)
    assert one.spec.name == "decode_bfloat16_d128" and one.grid == (1, 2, 2)
    assert one.out_partial.shape == (1, 1, 8, 128) and one.lse.shape == (2, 8)
    assert one.plan.cu_seqlens_q.tolist() == [0, 1, 2] and one.plan.block_tables.dtype == torch.int32
    assert math.isclose(one.softmax_scale_log2, 128 ** -0.5 * math.log2(math.e))
    three = prepare_decode_args(args, splits=3)
    assert three.out_partial.shape == (3, 2, 8, 128) and three.lse_partial.shape == (3, 2, 8)
    assert three.merge_spec.name == "decode_merge_bfloat16_d128"
    assert prepare_decode_args(args).num_splits == num_splits(2, 2, 700)


def test_a_step_plan_is_reused_by_every_layer():
    """What the engine does once per step (and once per captured CUDA-graph batch size, with the split
    count fixed): the plan's tables and split count are taken as they are, with no device sync."""
    args = decode_case([20, 700], heads=8, kv_heads=2, d=64, dtype=torch.bfloat16)
    plan = plan_decode(args.block_tables, args.context_lens, args.k_cache.shape[0], 2, splits=5)
    args.plan = plan
    launch = prepare_decode_args(args)
    assert launch.num_splits == 5 and launch.plan is plan and launch.out_partial.shape == (5, 2, 8, 64)
    other = decode_case([20, 700], heads=8, kv_heads=2, d=64, dtype=torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="another cache"):
        prepare_decode_args(DecodeArgs(other.q, other.k_cache[:-1], other.v_cache[:-1], other.block_tables,
                                       other.context_lens, 0.1, plan=plan))


def test_bad_inputs_raise_value_errors():
    args = decode_case([20, 33], heads=6, kv_heads=2, d=64, dtype=torch.bfloat16)
    num_blocks = args.k_cache.shape[0]
    with pytest.raises(ValueError, match="out of range"):  # a block id past the cache
        plan_decode(args.block_tables + num_blocks, args.context_lens, num_blocks, 2)
    with pytest.raises(ValueError, match="out of range"):  # negative block id
        plan_decode(args.block_tables - num_blocks, args.context_lens, num_blocks, 2)
    with pytest.raises(ValueError, match="out of range"):  # longer than the table holds
        plan_decode(args.block_tables, torch.tensor([20, 10_000]), num_blocks, 2)
    with pytest.raises(ValueError, match="out of range"):  # fewer keys than query tokens
        plan_decode(args.block_tables, torch.tensor([1, 33]), num_blocks, 2, torch.tensor([0, 2, 3]))
    with pytest.raises(ValueError, match="splits"):
        plan_decode(args.block_tables, args.context_lens, num_blocks, 2, splits=MAX_SPLITS + 1)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        prepare_decode_args(decode_case([20], heads=2, kv_heads=2, d=64))
    with pytest.raises(ValueError, match="GQA group"):
        prepare_decode_args(DecodeArgs(args.q[:, :5], args.k_cache, args.v_cache, args.block_tables,
                                       args.context_lens, 0.1))
    with pytest.raises(ValueError, match="exceed"):  # 24 tokens x group 3 > 64 rows
        prepare_decode_args(decode_case([30], heads=6, kv_heads=2, d=64, q_lens=[24], dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="contiguous"):
        prepare_decode_args(DecodeArgs(args.q, args.k_cache.transpose(0, 1).contiguous().transpose(0, 1),
                                       args.v_cache, args.block_tables, args.context_lens, 0.1))
    with pytest.raises(ValueError, match="CUDA"):
        decode_attention(args)


# ---------------------------------------------------------------------------------------------- GPU
def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


gpu = pytest.mark.skipif(not _hopper(), reason="needs an sm_90 GPU")
TOKEN_BUDGET = 70_000  # batch x context per case, so the whole grid runs in about a minute


def _grid():
    for batch in (1, 8, 64, 256):
        for context in (1, 15, 16, 17, 1000, 8192, 32768):
            if batch * context <= TOKEN_BUDGET:
                yield batch, context


def _launch_poisoned(args: DecodeArgs, splits: int | None):
    from cute_kernels.hopper.decode.decode_launch import launch_decode

    launch = prepare_decode_args(args, splits)
    for t in (launch.out, launch.lse, launch.out_partial, launch.lse_partial):
        t.fill_(float("nan"))
    launch_decode(launch)
    torch.cuda.synchronize()
    return launch


def _check(args: DecodeArgs, launch, dtype) -> None:
    ref_o, ref_lse = decode_split_ref(_on_cpu(args), launch.num_splits)
    want_o, want_lse = merge_splits_ref(ref_o, ref_lse)
    got = launch.out.float().cpu()
    assert not got.isnan().any() and not launch.lse.isnan().any()
    err = (got - want_o).flatten(2).norm(dim=-1) / want_o.flatten(2).norm(dim=-1).clamp_min(1e-6)
    worst = divmod(int(err.argmax()), err.shape[1])
    assert err.max() <= 1e-2, f"worst (token, head) relative error {err.max():.2e} at {worst}"
    torch.testing.assert_close(launch.lse.cpu(), want_lse, rtol=0, atol=1e-3)
    if launch.num_splits > 1:  # the partials themselves, where a split sees any key
        visible = ref_lse > -math.inf
        torch.testing.assert_close(launch.lse_partial.cpu(), ref_lse, rtol=0, atol=1e-3)
        part = launch.out_partial.cpu()[visible]
        rel = (part - ref_o[visible]).norm(dim=-1) / ref_o[visible].norm(dim=-1).clamp_min(1e-6)
        assert rel.max() <= 1e-2, f"partial output relative error {rel.max():.2e}"


def _on_cpu(args: DecodeArgs) -> DecodeArgs:
    move = lambda t: None if t is None else t.cpu()  # noqa: E731
    return DecodeArgs(args.q.cpu(), args.k_cache.cpu(), args.v_cache.cpu(), args.block_tables.cpu(),
                      args.context_lens.cpu(), args.scale, cu_seqlens_q=move(args.cu_seqlens_q))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("batch,context", list(_grid()))
def test_decode_numerics_gpu(batch, context, group, head_dim):
    lens = [max(1, context - (b * 7) % 17) for b in range(batch)]  # ragged around the target
    args = decode_case(lens, heads=2 * group, kv_heads=2, d=head_dim, dtype=torch.bfloat16, device="cuda")
    _check(args, _launch_poisoned(args, None), torch.bfloat16)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [1, 3, MAX_SPLITS])
@pytest.mark.parametrize("q_lens", [None, [4, 1, 2]])
def test_decode_splits_and_verify_gpu(splits, q_lens, dtype):
    """Forced split counts (partials compared) and speculative-verify query rows, both dtypes."""
    args = decode_case([70, 1000, 5], heads=16, kv_heads=2, d=128, q_lens=q_lens, dtype=dtype, device="cuda")
    _check(args, _launch_poisoned(args, splits), dtype)
