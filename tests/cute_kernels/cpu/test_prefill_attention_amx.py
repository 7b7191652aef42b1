"""The bf16 prefill attention (csrc/amx/cpu_prefill_attention_amx.c), on the AMX tiles and on vdpbf16ps, against
the torch reference on the values it multiplies, and when prefill_attention_cpu takes which. Each kernel's
tests skip on a CPU without its instructions (AMX-BF16; AVX-512 BF16).

Oracle and tolerance: the kernel rounds q * scale * log2(e), k and v (a cache row after dequantizing) to
bf16; the reference is run on those rounded values (q divided back), so what remains is the softmax
weights' own bf16 rounding before P V (relative 2^-9 each; they sum to 1) and fp32 sums. So an output
moves by at most 2^-9 * max|v| (every weight rounded the same way), plus 1e-5 for the exp2 polynomial and
fp32 sums: about 8e-3 for these randn values (measured: <= 3.7e-3); a key off the causal diagonal, a
misplaced pair or a stale block moves outputs by O(0.1).
"""
import math

import pytest
import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.cpu import build
from cute_kernels.cpu import prefill_attention as cpu_prefill
from cute_kernels.kv_quant import KVScales, dequantize
from cute_kernels.reference import prefill_attention_ref
from tests.cute_kernels.cpu.test_cpu_decode_attention import quantized
from tests.cute_kernels.cpu.test_cpu_prefill_attention import varlen_case

Q_LENS = [1, 5, 22, 64, 65, 130, 300]  # row tiles of 32 // group rows, key blocks of 64
PREFIXES = [0, 17, 0, 64, 100, 0, 333]


@pytest.fixture(params=["amx", "bf16"])
def kernel(request):
    name, flag = request.param, {"amx": "amx_bf16", "bf16": "avx512_bf16"}[request.param]
    if not cpu_prefill.available(name):
        pytest.skip(f"this CPU has no {flag}" if flag not in build.cpu_flags()
                    else f"bf16 attention library: {cpu_prefill._bf16_library()[1] or 'not built for ' + name}")
    return name


def rounded(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().float()


def check(kernel: str, args: PrefillArgs, k_rows: torch.Tensor | None = None,
          v_rows: torch.Tensor | None = None) -> None:
    """The kernel on args against the reference on the bf16 values it reads (caches given as fp32 rows)."""
    got = cpu_prefill.prefill_attention_cpu(args, kernel)
    fold = args.scale * math.log2(math.e)
    ref_args = PrefillArgs(rounded(args.q * fold) / fold, rounded(args.k), rounded(args.v), args.cu_seqlens_q,
                           args.cu_seqlens_k, args.scale, args.causal,
                           None if k_rows is None else rounded(k_rows), None if v_rows is None else rounded(v_rows),
                           args.block_tables, args.prefix_lens)
    v_max = max(t.abs().max().item() for t in (ref_args.v, ref_args.v_cache) if t is not None)
    torch.testing.assert_close(got, prefill_attention_ref(ref_args), rtol=0, atol=2 ** -9 * v_max + 1e-5)


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 64), (8, 1, 128), (32, 1, 64), (6, 2, 192)])
def test_matches_the_reference_on_a_bf16_cache(heads, kv_heads, d, kernel):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case(Q_LENS, PREFIXES, heads, kv_heads, d)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    check(kernel, PrefillArgs(q, k, v, cu, cu, d ** -0.5, True, k16, v16, tables, prefix), k16.float(), v16.float())


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
def test_an_8bit_prefix_is_dequantized_then_rounded(dtype, kernel):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case(Q_LENS, PREFIXES, 9, 3, 64)
    (k8, ks), (v8, vs) = quantized(k_cache, dtype), quantized(v_cache, dtype)
    args = PrefillArgs(q, k, v, cu, cu, 0.125, True, k8, v8, tables, prefix, kv_scales=KVScales(ks, vs))
    check(kernel, args, dequantize(k8, ks), dequantize(v8, vs))


def test_without_a_prefix_and_without_causality(kernel):
    q, k, v, cu, k_cache, v_cache, *_ = varlen_case([3, 70, 129, 0], [0, 0, 0, 0], 6, 2, 64)
    for causal in (True, False):
        check(kernel, PrefillArgs(q, k, v, cu, cu, 0.125, causal))


def test_reads_only_its_own_blocks_and_prefix(kernel):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([7, 40], [20, 33], 6, 2, 64)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    args = PrefillArgs(q, k, v, cu, cu, 0.125, True, k16, v16, tables, prefix)
    before = cpu_prefill.prefill_attention_cpu(args, kernel)
    used = set(tables[0, :2].tolist()) | set(tables[1, :3].tolist())
    for blk in set(range(k16.shape[0])) - used:
        k16[blk] = float("nan")
        v16[blk] = float("nan")
    k16[tables[0, 1], 4:] = float("nan")
    v16[tables[1, 2], 1:] = float("nan")
    torch.testing.assert_close(cpu_prefill.prefill_attention_cpu(args, kernel), before)


def test_taken_for_a_bf16_cache_only(kernel):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([40], [20], 9, 3, 64)
    head = (q, k, v, cu, cu, 0.125, True)
    best = "amx" if cpu_prefill.available("amx") else "bf16"
    assert cpu_prefill.bf16_kernel(PrefillArgs(*head, k_cache.bfloat16(), v_cache.bfloat16(), tables, prefix)) == best
    assert cpu_prefill.bf16_kernel(PrefillArgs(*head, k_cache, v_cache, tables, prefix)) is None  # fp32 cache
    assert cpu_prefill.bf16_kernel(PrefillArgs(*head)) is None
    dq, dk, dv, dcu, dkc, dvc, dt, dp = varlen_case([40], [20], 4, 4, 32)  # head_dim 32: the fp32 kernel
    assert cpu_prefill.bf16_kernel(PrefillArgs(dq, dk, dv, dcu, dcu, 0.1, True, dkc.bfloat16(), dvc.bfloat16(),
                                               dt, dp)) is None


def one_of(args: PrefillArgs, b: int) -> PrefillArgs:
    """Sequence b of args as a call of its own: the same rows, prefix and blocks."""
    rows = slice(int(args.cu_seqlens_q[b]), int(args.cu_seqlens_q[b + 1]))
    cu = torch.tensor([0, rows.stop - rows.start], dtype=torch.int32)
    return PrefillArgs(args.q[rows], args.k[rows], args.v[rows], cu, cu, args.scale, args.causal, args.k_cache,
                       args.v_cache, args.block_tables[b:b + 1], args.prefix_lens[b:b + 1])


def test_a_sequence_takes_its_kernel_by_its_own_rows_whatever_shares_the_call(kernel):
    """Few new rows run the fp32 kernel (packing every key would cost more), many a bf16 one, per sequence:
    a short chunk beside long prompts gives the bits it gives alone, and so do they."""
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([40, cpu_prefill.BF16_MIN_Q_ROWS - 1, 70, 3],
                                                                [20, 30, 0, 100], 9, 3, 64)
    both = PrefillArgs(q, k, v, cu, cu, 0.125, True, k_cache.bfloat16(), v_cache.bfloat16(), tables, prefix)
    mixed = cpu_prefill.prefill_attention_cpu(both)
    bf16 = cpu_prefill.bf16_kernel(both)
    for b, kind in enumerate((bf16, "fp32", bf16, "fp32")):
        alone = one_of(both, b)
        assert torch.equal(mixed[int(cu[b]):int(cu[b + 1])], cpu_prefill.prefill_attention_cpu(alone, kind)), b
        assert torch.equal(cpu_prefill.prefill_attention_cpu(alone), cpu_prefill.prefill_attention_cpu(alone, kind)), b


@pytest.mark.parametrize("name,flag", [("amx", "amx_bf16"), ("bf16", "avx512_bf16")])
def test_routes_without_the_instructions_never_take_them(cpu_route, name, flag):
    if cpu_route == "avx512-vnni" and flag in build.cpu_flags():
        assert cpu_prefill.available(name)  # the native build on such a CPU must not silently lose the kernel
        return
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([40], [20], 9, 3, 64)
    args = PrefillArgs(q, k, v, cu, cu, 0.125, True, k_cache.bfloat16(), v_cache.bfloat16(), tables, prefix)
    assert not cpu_prefill.available(name) and cpu_prefill.bf16_kernel(args) != name
    with pytest.raises(RuntimeError, match="not available"):
        cpu_prefill.prefill_attention_cpu(args, name)
    with pytest.raises(ValueError, match="unknown prefill attention kernel"):
        cpu_prefill.prefill_attention_cpu(args, "bf32")
