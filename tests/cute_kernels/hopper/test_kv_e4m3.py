"""An e4m3 KV cache on Hopper: the quantizing KV write, and the decode and prefill (paged prefix) kernels
that read it.

CPU: the host picks the e4m3 variants and checks the scales; the kernels compile for sm_90a and their
SASS shows the conversions (F2FP e4m3 unpack after 16-byte shared loads in decode, saturating packs in
the write); the rules fire on kernels mutated to skip them. GPU (marker gpu, skipped without an sm_90
GPU): the write's bytes against cute_kernels.kv_e4m3, and decode per (sequence, head) against the fp32
reference over the dequantized bytes, eagerly and replayed from a CUDA graph; prefill with an e4m3
prefix per (sequence, head) against the reference over the prefix dequantized as the kernel does.

Tolerances: the write computes x / scale in IEEE fp32 (div.rn) and rounds to nearest-even with
saturation, as torch does: its bytes must be equal. Decode reads the same bytes; e4m3 values are exact
in bf16, the K scale multiplies each score in fp32 instead of each key (a few fp32 ulps) and the V
scale the output: the error budget is the bf16 kernel's (P rounded to bf16, the output's rounding,
~2^-8 relative), so the same 1e-2 relative L2 per (token, head) and 1e-3 absolute on the LSE. Prefill
rounds stored * scale (fp32) to bf16 once per element, as dequantize_e4m3(..., bf16) does: over that
cache the kernel is the bf16 kernel, so test_prefill_attention's bounds hold unchanged (per sequence
and head, twice the bf16 reference's own error plus an ulp; LSE within 2e-3).
"""
from __future__ import annotations

import math

import pytest
import torch

from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.hopper.decode.decode_host import prepare_decode_args
from cute_kernels.hopper.decode.decode_spec import FP8_KV, DecodeSpec, decode_specs
from cute_kernels.hopper.fused.fused_host import prepare_write_kv, stacked_scales
from cute_kernels.hopper.fused.fused_spec import FusedOpSpec
from cute_kernels.hopper.prefill.prefill_host import prepare_prefill_args
from cute_kernels.hopper.prefill.prefill_spec import PrefillSpec
from cute_kernels.kv_e4m3 import dequantize_e4m3, quantize_e4m3, write_kv_e4m3_ref
from cute_kernels.kv_quant import KVScales
from tests.cute_kernels.hopper.test_decode_attention import _check, decode_case, gpu
from tests.cute_kernels.hopper.test_prefill_attention import (
    LENGTH_MIX,
    PREFIX_MIX,
    assert_matches_reference,
    make_batch,
)

E4M3 = torch.float8_e4m3fn


def e4m3_case(lens, heads, kv_heads, d, q_lens=None, device="cpu", seed=0):
    """(args over an e4m3 cache with per-head scales, the same args over its dequantized fp32 bytes).
    Unowned slots hold NaN bytes (decode_case's poison survives quantization)."""
    args = decode_case(lens, heads, kv_heads, d, q_lens=q_lens, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    scales = [torch.rand(kv_heads, generator=g) * 0.02 + 0.005 for _ in range(2)]  # randn / scale ~ 40-200
    stored = [quantize_e4m3(c, s) for c, s in zip((args.k_cache, args.v_cache), scales)]
    exact = DecodeArgs(args.q, *(dequantize_e4m3(c, s) for c, s in zip(stored, scales)), args.block_tables,
                       args.context_lens, args.scale, cu_seqlens_q=args.cu_seqlens_q)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    fp8 = DecodeArgs(args.q.to(device, torch.bfloat16), to(stored[0]), to(stored[1]), to(args.block_tables),
                     to(args.context_lens), args.scale, cu_seqlens_q=to(args.cu_seqlens_q), kv_scales=KVScales(to(scales[0]), to(scales[1])))
    exact.q = fp8.q.float().cpu()  # the reference takes the kernel's bf16 queries exactly
    return fp8, exact


# ---------------------------------------------------------------------------------------------- CPU
def test_the_runtime_variants_include_e4m3_caches():
    names = {s.name for s in decode_specs()}
    assert {"decode_bfloat16_d128_kv_e4m3", "decode_float16_d64_kv_e4m3"} <= names
    for d in (64, 128):  # two CTAs per SM still fit (228 KiB, 1 KiB reserved per CTA)
        assert 2 * (DecodeSpec("bfloat16", d, FP8_KV).smem_bytes + 1024) <= 228 * 1024
    with pytest.raises(ValueError, match="kv_dtype"):
        DecodeSpec("bfloat16", 128, "int8")


def test_quantize_saturates_and_rounds_like_torch():
    x = torch.tensor([[[1000.0, -1000.0, 3.0, float("nan")]]])
    stored = quantize_e4m3(x, torch.tensor([2.0]))
    assert stored.dtype == E4M3
    assert stored.float()[0, 0, :3].tolist() == [448.0, -448.0, 1.5] and stored.float()[0, 0, 3].isnan()
    assert dequantize_e4m3(stored, torch.tensor([2.0]))[0, 0, :3].tolist() == [896.0, -896.0, 3.0]


def test_decode_host_picks_the_e4m3_variant_and_passes_the_scales():
    fp8, _ = e4m3_case([20, 70], heads=8, kv_heads=2, d=64)
    launch = prepare_decode_args(fp8, splits=2)
    assert launch.spec == DecodeSpec("bfloat16", 64, FP8_KV)
    assert launch.kernel_tensors()[-2:] == (fp8.kv_scales.k, fp8.kv_scales.v)
    bf16 = prepare_decode_args(decode_case([20], heads=2, kv_heads=2, d=64, dtype=torch.bfloat16))
    assert not bf16.spec.fp8_kv and bf16.k_scale.dtype == torch.float32  # a placeholder, never read


@pytest.mark.parametrize("change,match", [
    (dict(k_scale=None), "k_scale"),
    (dict(v_scale=torch.ones(3)), "v_scale as contiguous fp32 \\[2\\]"),
    (dict(k_scale=torch.ones(2, dtype=torch.float64)), "k_scale"),
])
def test_decode_host_refuses_bad_scales(change, match):
    fp8, _ = e4m3_case([20], heads=2, kv_heads=2, d=64)
    fp8.kv_scales = KVScales(change.get("k_scale", fp8.kv_scales.k), change.get("v_scale", fp8.kv_scales.v))
    with pytest.raises(ValueError, match=match):
        prepare_decode_args(fp8)


def test_decode_host_refuses_a_mixed_cache():
    fp8, _ = e4m3_case([20], heads=2, kv_heads=2, d=64)
    fp8.v_cache = fp8.v_cache.to(torch.bfloat16)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        prepare_decode_args(fp8)


def _write_operands(tokens=5, kv_heads=2, d=64, blocks=4):
    g = torch.Generator().manual_seed(3)
    kv = [torch.randn(tokens, kv_heads, d, generator=g).to(torch.bfloat16) for _ in range(2)]
    caches = [torch.zeros(blocks, 16, kv_heads, d, dtype=E4M3) for _ in range(2)]
    scales = [torch.rand(kv_heads, generator=g) + 0.01 for _ in range(2)]
    slots = torch.tensor([3, -1, 17, 40, 63])[:tokens]
    return kv, caches, slots, scales


def test_write_host_picks_the_quantizing_variant_with_stacked_scales():
    (k, v), (kc, vc), slots, (ks, vs) = _write_operands()
    launch = prepare_write_kv(k, v, kc, vc, slots, ks, vs)
    assert launch.spec == FusedOpSpec("write_kv_e4m3", "bfloat16", 64)
    assert torch.equal(launch.matrices[4], torch.stack((ks, vs)))
    assert prepare_write_kv(k, v, kc, vc, slots, ks, vs).matrices[4] is launch.matrices[4]  # made once
    ks.mul_(2)  # an in-place update (a new calibration) is seen
    assert torch.equal(stacked_scales(ks, vs, 2, ks.device)[0], ks)


def test_write_host_refuses_missing_scales_and_unknown_head_dims():
    (k, v), (kc, vc), slots, (ks, vs) = _write_operands()
    with pytest.raises(ValueError, match="v_scale fp32 \\[2\\]"):
        prepare_write_kv(k, v, kc, vc, slots, ks, None)
    (k, v), (kc, vc), slots, (ks, vs) = _write_operands(d=96)
    with pytest.raises(ValueError, match="head_dim 96"):
        prepare_write_kv(k, v, kc, vc, slots, ks, vs)


def test_write_reference_skips_padding_slots():
    (k, v), (kc, vc), slots, (ks, vs) = _write_operands()
    write_kv_e4m3_ref(k, v, kc, vc, slots, ks, vs)
    flat = kc.view(-1, 2, 64)
    assert torch.equal(flat[17].view(torch.uint8), quantize_e4m3(k[2], ks).view(torch.uint8))
    assert int(torch.count_nonzero(flat.view(torch.uint8).flatten(1).any(1))) == 4  # 4 tokens, one skipped


def prefill_e4m3_batch(heads, kv_heads, d, device="cpu", lens=(17, 129, 300), prefixes=(33, 0, 700)):
    """(make_batch's bf16 inputs with the prefix quantized to e4m3 + scales, the same with the prefix
    dequantized to bf16 as the kernel converts it)."""
    x = make_batch(list(lens), list(prefixes), heads, kv_heads, d, dtype=torch.bfloat16, device=device)
    scales = [torch.full((kv_heads,), 0.01, device=device) + 0.003 * torch.arange(kv_heads, device=device)
              for _ in range(2)]
    stored = [quantize_e4m3(x[name], s) for name, s in zip(("k_cache", "v_cache"), scales)]
    fp8 = {**x, "k_cache": stored[0], "v_cache": stored[1]}
    ref = {**x, **{n: dequantize_e4m3(c, s, torch.bfloat16) for n, c, s in zip(("k_cache", "v_cache"), stored, scales)}}
    return fp8, ref, scales


def _prefill_args(x: dict, scales, with_prefix: bool = True) -> PrefillArgs:
    cache = dict(k_cache=x["k_cache"], v_cache=x["v_cache"], block_tables=x["block_tables"],
                 prefix_lens=x["prefix_lens"]) if with_prefix else {}
    return PrefillArgs(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], x["q"].shape[2] ** -0.5, True,
                       **cache, kv_scales=KVScales(scales[0], scales[1]))


def test_prefill_host_picks_the_e4m3_prefix_variant():
    fp8, _, scales = prefill_e4m3_batch(8, 2, 64)
    launch = prepare_prefill_args(_prefill_args(fp8, scales))
    assert launch.spec == PrefillSpec("bfloat16", 64, 4, True, FP8_KV)
    assert launch.kernel_tensors()[-2:] == tuple(scales)
    # no prefix: the cache is never read, the 16-bit variant runs
    assert not prepare_prefill_args(_prefill_args(fp8, scales, with_prefix=False)).spec.fp8_kv
    with pytest.raises(ValueError, match="k_scale"):
        prepare_prefill_args(_prefill_args(fp8, (None, scales[1])))


# ------------------------------------------------------------------ compile + SASS (CPU, needs the DSL)
@pytest.fixture
def _dsl(tmp_path, monkeypatch):
    pytest.importorskip("cutlass", reason="needs nvidia-cutlass-dsl (the hopper extra)")
    from cute_kernels.toolchain.sass import find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the DSL's cache goes under $TMPDIR


def _decode_problems(spec):
    from cute_kernels.hopper.decode.decode_checks import decode_sass_problems
    from cute_kernels.hopper.decode.decode_compile import compile_decode
    from cute_kernels.toolchain.sass import sass_stats

    stats = sass_stats(compile_decode(spec, keep_artifacts=True).artifacts["cubin"])
    return stats, decode_sass_problems(spec, stats)


def _fused_problems(spec):
    from cute_kernels.hopper.fused.fused_compile import compile_fused
    from cute_kernels.hopper.fused.fused_family import fused_sass_problems
    from cute_kernels.toolchain.sass import sass_stats

    stats = sass_stats(compile_fused(spec, keep_artifacts=True).artifacts["cubin"])
    return stats, fused_sass_problems(spec, stats)


def test_e4m3_decode_dequantizes_in_registers_and_the_rule_fires_without(_dsl, monkeypatch):
    from cute_kernels.hopper.decode.decode_attention import DecodeAttentionSm90

    spec = DecodeSpec("float16", 64, FP8_KV)  # the smaller compile; the check covers every variant
    stats, problems = _decode_problems(spec)
    assert problems == [] and stats.spills == 0 and stats.tma_load and stats.qgmma == 0
    monkeypatch.setattr(DecodeAttentionSm90, "dequant_stage", lambda self, *args: None)  # the bug put back
    _, problems = _decode_problems(spec)
    assert any("not dequantized" in p for p in problems), problems


def test_e4m3_prefill_prefix_dequantizes_and_the_rule_fires_without(_dsl, monkeypatch):
    from cute_kernels.hopper.prefill.prefill_compile import compile_prefill
    from cute_kernels.hopper.prefill.prefill_family import prefill_sass_problems
    from cute_kernels.hopper.prefill.prefill_loads import PrefillLoads
    from cute_kernels.toolchain.sass import sass_stats

    spec = PrefillSpec("float16", 64, 1, True, FP8_KV)

    def problems():
        stats = sass_stats(compile_prefill(spec, keep_artifacts=True).artifacts["cubin"])
        return stats, prefill_sass_problems(spec, stats)

    stats, found = problems()
    assert found == [] and stats.spills == 0 and stats.fp8_unpack
    monkeypatch.setattr(PrefillLoads, "dequant_prefix", lambda self, *args: None)  # raw bytes never converted
    _, found = problems()
    assert any("prefix is not dequantized" in p for p in found), found


def test_e4m3_write_quantizes_saturating_and_the_rule_fires_without(_dsl, monkeypatch):
    import cutlass.cute as cute

    from cute_kernels.hopper.fused.kv_write import KvWriteE4m3Sm90

    spec = FusedOpSpec("write_kv_e4m3", "float16", 128)
    stats, problems = _fused_problems(spec)
    assert problems == [] and stats.fp8_pack >= 16 and stats.spills == 0

    @cute.jit
    def raw_zeros(self, src, scale, dst):  # stores without converting anything
        q = cute.make_rmem_tensor((16,), dst.element_type)
        q.fill(0.0)
        cute.autovec_copy(q, dst)

    monkeypatch.setattr(KvWriteE4m3Sm90, "_quantize", raw_zeros)
    _, problems = _fused_problems(spec)
    assert any("not quantized" in p for p in problems), problems


# ---------------------------------------------------------------------------------------------- GPU
def _decode_gpu(fp8: DecodeArgs, splits):
    from cute_kernels.hopper.decode.decode_launch import launch_decode

    launch = prepare_decode_args(fp8, splits)
    for t in (launch.out, launch.lse, launch.out_partial, launch.lse_partial):
        t.fill_(float("nan"))
    launch_decode(launch)
    torch.cuda.synchronize()
    return launch


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group,splits,q_lens", [(1, None, None), (8, None, None), (8, 3, None), (4, 2, [3, 1, 2])])
def test_e4m3_decode_matches_the_dequantized_reference_gpu(head_dim, group, splits, q_lens):
    lens = [1, 17, 1000] if q_lens is None else [70, 5, 300]
    fp8, exact = e4m3_case(lens, heads=2 * group, kv_heads=2, d=head_dim, q_lens=q_lens, device="cuda")
    _check(exact, _decode_gpu(fp8, splits), torch.bfloat16)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_e4m3_write_bytes_equal_the_reference_gpu(d, dtype):
    from cute_kernels.hopper.fused.fused_ops import write_kv

    (k, v), (kc, vc), slots, (ks, vs) = _write_operands(kv_heads=4, d=d)
    k = (k.float() * 300).to(dtype)  # past 448 * scale: saturates
    v = v.to(dtype)
    want = [kc.clone(), vc.clone()]
    write_kv_e4m3_ref(k, v, *want, slots, ks, vs)
    cuda = [t.cuda() for t in (k, v, kc, vc, slots, ks, vs)]
    write_kv(*cuda)
    torch.cuda.synchronize()
    for got, ref in zip(cuda[2:4], want):
        assert torch.equal(got.cpu().view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.gpu
@gpu
def test_e4m3_write_and_decode_replay_from_a_cuda_graph_gpu():
    """One captured step (write the new token's K/V, then decode over the cache), replayed after the
    step's inputs change in place, equals the reference over the same bytes."""
    from cute_kernels.hopper.decode.decode_host import decode_attention, plan_decode
    from cute_kernels.hopper.decode.decode_spec import num_splits
    from cute_kernels.hopper.fused.fused_ops import write_kv

    fp8, _ = e4m3_case([40, 300], heads=8, kv_heads=2, d=128, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    new_kv = [torch.randn(2, 2, 128, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2)]
    slots = torch.zeros(2, dtype=torch.int64, device="cuda")
    lens = fp8.context_lens

    def set_step(extra: int) -> None:  # the new token sits at position lens - 1
        lens.copy_(torch.tensor([40, 300], device="cuda") + extra)
        pos = lens.long() - 1
        slots.copy_(fp8.block_tables.long().gather(1, (pos // 16).view(-1, 1)).view(-1) * 16 + pos % 16)
        for t in new_kv:
            t.normal_(generator=g)

    set_step(0)
    plan = plan_decode(fp8.block_tables, lens, fp8.k_cache.shape[0], 2, splits=num_splits(2, 2, 4096))
    step = DecodeArgs(fp8.q, fp8.k_cache, fp8.v_cache, fp8.block_tables, lens, fp8.scale, plan=plan,
                      kv_scales=fp8.kv_scales)

    def run():
        write_kv(*new_kv, fp8.k_cache, fp8.v_cache, slots, fp8.kv_scales.k, fp8.kv_scales.v)
        return decode_attention(step)

    run()  # compile / load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    set_step(1)  # one more token each: still inside the blocks the tables own
    graph.replay()
    torch.cuda.synchronize()
    exact = DecodeArgs(fp8.q.float().cpu(), dequantize_e4m3(fp8.k_cache.cpu(), fp8.kv_scales.k.cpu()),
                       dequantize_e4m3(fp8.v_cache.cpu(), fp8.kv_scales.v.cpu()), fp8.block_tables.cpu(), lens.cpu(),
                       fp8.scale)
    from cute_kernels.reference import decode_attention_ref

    want = decode_attention_ref(exact)
    err = (out.float().cpu() - want).flatten(2).norm(dim=-1) / want.flatten(2).norm(dim=-1).clamp_min(1e-6)
    assert err.max() <= 1e-2 and not math.isnan(float(err.max()))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (32, 8)])
def test_e4m3_prefix_prefill_matches_the_dequantized_reference_gpu(heads, kv_heads, head_dim):
    from cute_kernels.hopper.prefill.prefill_launch import launch_prefill

    fp8, ref, scales = prefill_e4m3_batch(heads, kv_heads, head_dim, "cuda", LENGTH_MIX, PREFIX_MIX)
    launch = prepare_prefill_args(_prefill_args(fp8, scales))
    assert launch.spec.fp8_kv
    launch.out.fill_(float("nan"))
    launch.lse.fill_(float("nan"))
    launch_prefill(launch)
    torch.cuda.synchronize()
    assert_matches_reference(ref, launch.out, launch.lse, head_dim ** -0.5, True, True)
