"""The C paged decode attention against its torch reference on every SIMD route this machine runs
(the `cpu_route` fixture), and in the engine.

Tolerance: both sides are fp32 with an fp32 softmax; only the summation order differs (the C
kernel sums head_dim products in SIMD lanes and the context in token order, BLAS in tiles), so
results agree to a few fp32 ulps of the O(1) outputs: 2e-5 absolute is tight and still safe.
"""
import pytest
import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.cpu import build
from cute_kernels.cpu.decode_attention import (
    decode_attention_cpu,
    prepare_tables,
    round_to_bf16,
    store_rows,
    supports,
    unavailable_reason,
)
from cute_kernels.kv_quant import QMAX, KVScales, dequantize, quantize
from cute_kernels.reference import decode_attention_ref
from runtime.accel.cpu_backend import CpuBackend
from runtime.accel.select_backend import select_backend
from runtime.llm import LLM
from runtime.model.torch_backend import TorchBackend
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine


def paged_case(lens, heads, kv_heads, d, bs=16, seed=0):
    """A cache with more blocks than needed, each sequence's blocks scattered at random."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max((n + bs - 1) // bs for n in lens)
    num_blocks = len(lens) * max_blocks + 7
    k_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * max_blocks].view(len(lens), max_blocks)
    q = torch.randn(len(lens), heads, d, generator=g) * 2  # sharper softmax than unit scale
    return q, k_cache, v_cache, tables.int(), torch.tensor(lens, dtype=torch.int32)


def test_the_kernel_builds_here(cpu_route):
    assert unavailable_reason() is None  # CI machines have a C compiler: the fast path must not silently vanish
    assert build.isa(build.load("cpu_decode_attention")[0]) == cpu_route


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 64), (8, 1, 128), (16, 2, 32)])
@pytest.mark.parametrize("bs", [16, 8])
def test_matches_reference(heads, kv_heads, d, bs, cpu_route):
    lens = [1, bs - 1, bs, bs + 1, 3 * bs, 200, 517]
    q, k_cache, v_cache, tables, ctx = paged_case(lens, heads, kv_heads, d, bs)
    scale = d ** -0.5
    want = decode_attention_ref(DecodeArgs(q, k_cache, v_cache, tables, ctx, scale))
    got = decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, ctx, scale))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    prepared = prepare_tables(tables, ctx, *k_cache.shape[:2])  # what the engine does once per step
    torch.testing.assert_close(decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, ctx, scale, prepared)), got)


def test_reads_only_its_own_blocks_and_length(cpu_route):
    q, k_cache, v_cache, tables, ctx = paged_case([20, 33], 6, 2, 64)
    before = decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, ctx, 0.125))
    used = set(tables[0, :2].tolist()) | set(tables[1, :3].tolist())
    for blk in set(range(k_cache.shape[0])) - used:  # blocks nobody owns
        k_cache[blk] = float("nan")
        v_cache[blk] = float("nan")
    k_cache[tables[0, 1], 4:] = float("nan")  # past sequence 0's 20 tokens in its last block
    torch.testing.assert_close(decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, ctx, 0.125)), before)


def test_bad_inputs_raise_instead_of_reading_stray_memory(cpu_route):
    q, k_cache, v_cache, tables, ctx = paged_case([20, 33], 6, 2, 64)
    with pytest.raises(ValueError, match="out of range"):
        decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, torch.tensor([20, 33 + 16], dtype=torch.int32), 0.1))
    with pytest.raises(ValueError, match="out of range"):
        decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables + k_cache.shape[0], ctx, 0.1))
    with pytest.raises(ValueError, match="out of range"):
        decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, torch.tensor([0, 5], dtype=torch.int32), 0.1))
    assert not supports(q.bfloat16(), k_cache.bfloat16())  # bf16 stays on the reference
    with pytest.raises(ValueError, match="unsupported"):
        decode_attention_cpu(DecodeArgs(q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16(), tables, ctx, 0.1))


def test_engine_output_is_the_same_with_the_reference_decode():
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 40, 90)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = []
    for c_kernel in (True, False):
        engine = tiny_engine()
        backend = engine.model_runner.model.backend
        assert isinstance(backend, CpuBackend) and backend.c_decode  # on by default here
        engine.model_runner.model.backend = CpuBackend() if c_kernel else TorchBackend()
        outputs.append([o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(prompts, params,
                                                                                           use_tqdm=False)])
    assert outputs[0] == outputs[1]
    assert type(select_backend("torch", torch.device("cpu"), torch.bfloat16)) is TorchBackend  # the kernel is fp32-only


def test_loading_the_kernel_keeps_denormals_for_everyone_else():
    assert unavailable_reason() is None
    tiny = torch.tensor([1e-38]) * 1e-3  # a denormal: flush-to-zero mode (crtfastmath) would make it 0
    assert tiny.item() != 0.0


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 1, 128), (16, 2, 40)])
def test_a_bf16_cache_reads_as_its_widened_fp32_copy(heads, kv_heads, d, cpu_route):
    """bf16 -> fp32 is exact and the kernel widens a block's rows before the same fp32 loops, so a bf16
    cache gives bit for bit the fp32 kernel's result on cache.float(); the reference (the same math on
    the rounded cache) differs by summation order only, hence the fp32 tolerance above."""
    lens = [1, 15, 16, 17, 200, 517]
    q, k_cache, v_cache, tables, ctx = paged_case(lens, heads, kv_heads, d)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    got = decode_attention_cpu(DecodeArgs(q, k16, v16, tables, ctx, d ** -0.5))
    assert torch.equal(got, decode_attention_cpu(DecodeArgs(q, k16.float(), v16.float(), tables, ctx, d ** -0.5)))
    want = decode_attention_ref(DecodeArgs(q, k16.float(), v16.float(), tables, ctx, d ** -0.5))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert torch.equal(decode_attention_ref(DecodeArgs(q, k16, v16, tables, ctx, d ** -0.5)), want)


def test_mixed_cache_dtypes_are_refused(cpu_route):
    q, k_cache, v_cache, tables, ctx = paged_case([20], 4, 2, 64)
    with pytest.raises(ValueError):
        decode_attention_cpu(DecodeArgs(q, k_cache.bfloat16(), v_cache, tables, ctx, 0.125))
    with pytest.raises(ValueError):
        decode_attention_cpu(DecodeArgs(q, k_cache.half(), v_cache.half(), tables, ctx, 0.125))


def test_the_c_bf16_rounding_is_torchs(cpu_route):
    """Nearest even on exact ties (both directions), carries into the exponent, infinities, NaN, denormals."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0x3F7FFFFF, 0x7F7FFFFF, 0x00008000, 0x00018000],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    special = torch.tensor([0.0, -0.0, 1.0, float("inf"), -float("inf"), 1e-40, -3.3e38, 65504.0])
    x = torch.cat([ties, special, torch.randn(10_000, generator=torch.Generator().manual_seed(1)) * 100])
    assert torch.equal(round_to_bf16(x).view(torch.int16), x.bfloat16().view(torch.int16))
    assert round_to_bf16(torch.tensor([float("nan")])).isnan().all()


def quantized(cache: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cache [blocks, bs, kv_heads, d] quantized with scales amax / qmax per KV head: (stored, scales)."""
    scales = (cache.abs().amax(dim=(0, 1, 3)) / QMAX[dtype]).contiguous()
    return quantize(cache, dtype, scales), scales


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 1, 128), (16, 2, 40)])
def test_an_8bit_cache_reads_as_its_dequantized_copy(dtype, heads, kv_heads, d, cpu_route):
    """The kernel widens an 8-bit block's rows into stored * scale (one fp32 rounding, as torch's
    stored.float() * scale) before the same fp32 loops: bit for bit the fp32 kernel on the dequantized
    cache; the reference reading the same bytes differs by summation order only (2e-5, as above)."""
    lens = [1, 15, 16, 17, 200, 517]
    q, k_cache, v_cache, tables, ctx = paged_case(lens, heads, kv_heads, d)
    (k8, ks), (v8, vs) = quantized(k_cache, dtype), quantized(v_cache, dtype)
    scales, scale = KVScales(ks, vs), d ** -0.5
    got = decode_attention_cpu(DecodeArgs(q, k8, v8, tables, ctx, scale, kv_scales=scales))
    k32, v32 = dequantize(k8, ks), dequantize(v8, vs)
    assert torch.equal(got, decode_attention_cpu(DecodeArgs(q, k32, v32, tables, ctx, scale)))
    want = decode_attention_ref(DecodeArgs(q, k8, v8, tables, ctx, scale, kv_scales=scales))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert torch.equal(want, decode_attention_ref(DecodeArgs(q, k32, v32, tables, ctx, scale)))


def test_every_e4m3_code_reads_as_torchs_value(cpu_route):
    """Each of the 254 finite e4m3 bytes (subnormals, both signs, +-448) dequantized by the kernel: a
    cache of those bytes at scale 1 against one head of one-hot queries reads each value back exactly."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    d = 16
    cache = torch.zeros(codes.numel(), d, dtype=torch.uint8)
    cache[:, 0] = codes  # token t holds code t in lane 0
    v8 = cache.view(torch.float8_e4m3fn).view(-1, 1, 1, d)  # one token per block
    k8 = torch.zeros_like(v8)  # equal scores: the output is the mean of the values
    ones = torch.ones(1)
    for t in range(0, codes.numel(), 37):
        tables, ctx = torch.tensor([[t]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
        out = decode_attention_cpu(DecodeArgs(torch.zeros(1, 1, d), k8, v8, tables, ctx, 1.0,
                                              kv_scales=KVScales(ones, ones)))
        assert out[0, 0, 0].item() == v8[t, 0, 0, 0].float().item()


def test_the_c_8bit_quantization_is_the_contracts(cpu_route):
    """stored = round(x / scale), nearest even, saturated: the C store (the fused decode step's) against
    torch's on ties, the range's ends, beyond it, subnormal e4m3 steps and NaN, byte for byte."""
    scales = torch.tensor([0.5, 1.0, 3.0])
    steps = torch.tensor([0.0, -0.0, 0.25, 0.75, 1.25, -2.5, 126.5, 127.5, -128.5, 1e9, -1e9, float("inf")])
    e4m3 = torch.arange(0, 126, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # every finite magnitude
    mids = torch.cat([(e4m3[1:] + e4m3[:-1]) / 2, e4m3 * (1 + 2**-20), e4m3 * (1 - 2**-20), torch.tensor([450.0, 464.0, 500.0])])
    noise = torch.randn(3000, generator=torch.Generator().manual_seed(2)) * 40
    for dtype, special in ((torch.int8, steps), (torch.float8_e4m3fn, torch.cat([steps, mids, -mids]))):
        x = torch.cat([special, noise])
        x = x[: x.numel() // 3 * 3].view(-1, 3, 1) * scales.view(1, 3, 1)  # each head its own scale
        got, want = store_rows(x, dtype, scales), quantize(x, dtype, scales)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), dtype
    nan = store_rows(torch.full((1, 1, 4), float("nan")), torch.float8_e4m3fn, torch.ones(1))
    assert nan.float().isnan().all()


def test_an_8bit_cache_without_scales_is_refused(cpu_route):
    q, k_cache, v_cache, tables, ctx = paged_case([20], 4, 2, 64)
    k8, ks = quantized(k_cache, torch.int8)
    with pytest.raises(ValueError, match="needs its k/v scales"):
        decode_attention_cpu(DecodeArgs(q, k8, k8, tables, ctx, 0.125))
    with pytest.raises(ValueError, match="shape \\(2,\\)"):
        decode_attention_cpu(DecodeArgs(q, k8, k8, tables, ctx, 0.125, kv_scales=KVScales(ks[:1], ks[:1])))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_contexts_split_into_chunks_merge_to_the_reference(dtype, cpu_route):
    """Past 256 tokens a row's context is cut into chunks (split-KV) merged by log-sum-exp: contexts of 1-9
    chunks, with one key made to dominate in a late chunk of one row and an early chunk of another, so
    a wrong rescale of any chunk's sums moves the output by O(1). Tolerance as above (fp32 either way)."""
    lens = [2100, 257, 256, 600, 1]
    q, k_cache, v_cache, tables, ctx = paged_case(lens, 9, 3, 64)
    for row, t in ((0, 1900), (3, 5)):  # key t of row `row` aligned with its queries: a sharp peak
        blk, off = tables[row, t // 16], t % 16
        k_cache[blk, off] = q[row].view(3, 3, 64)[:, 0] * 4
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    want = decode_attention_ref(DecodeArgs(q, k_cache.float(), v_cache.float(), tables, ctx, 0.125))
    got = decode_attention_cpu(DecodeArgs(q, k_cache, v_cache, tables, ctx, 0.125))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


def test_a_rows_bits_depend_on_neither_its_batch_nor_the_thread_count(cpu_route):
    """The split depends on the context length alone: a row alone, in a batch, on one or two threads."""
    q, k_cache, v_cache, tables, ctx = paged_case([1500, 40, 700], 9, 3, 64)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    batch = decode_attention_cpu(DecodeArgs(q, k16, v16, tables, ctx, 0.125))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for b in range(3):
            alone = decode_attention_cpu(DecodeArgs(q[b:b + 1], k16, v16, tables[b:b + 1], ctx[b:b + 1], 0.125))
            assert torch.equal(alone[0], batch[b])
    finally:
        torch.set_num_threads(threads)
