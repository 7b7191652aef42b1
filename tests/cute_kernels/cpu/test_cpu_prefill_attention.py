"""The C varlen prefill attention against its torch reference on every SIMD route this machine runs
(the `cpu_route` fixture), and in the engine.

Tolerance: both sides are fp32 with an fp32 softmax; only the summation order differs (the C
kernel sums in key tiles with an online softmax, SDPA in its own blocks), so results agree to a
few fp32 ulps of the O(1) outputs: 2e-5 absolute is tight and still safe.
"""
import pytest
import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.cpu import build
from cute_kernels.cpu import prefill_attention as cpu_prefill
from cute_kernels.cpu.prefill_attention import (
    prefill_attention_cpu,
    prepare_tables,
    supports,
    unavailable_reason,
)
from cute_kernels.kv_quant import KVScales, dequantize
from cute_kernels.reference import prefill_attention_ref
from runtime.accel.cpu_backend import CpuBackend
from runtime.accel.select_backend import select_backend
from runtime.model.torch_backend import TorchBackend
from tests.cute_kernels.cpu.test_cpu_decode_attention import quantized


def varlen_case(q_lens, prefixes, heads, kv_heads, d, bs=16, seed=0):
    """New rows of several sequences, each after a prefix held in scattered blocks of a paged cache."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(1, max((p + bs - 1) // bs for p in prefixes))
    num_blocks = len(q_lens) * max_blocks + 5
    k_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    v_cache = torch.randn(num_blocks, bs, kv_heads, d, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[: len(q_lens) * max_blocks].view(len(q_lens), max_blocks).int()
    total = sum(q_lens)
    q = torch.randn(total, heads, d, generator=g) * 2  # sharper softmax than unit scale
    k = torch.randn(total, kv_heads, d, generator=g)
    v = torch.randn(total, kv_heads, d, generator=g)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu, k_cache, v_cache, tables, torch.tensor(prefixes, dtype=torch.int32)


def test_the_kernel_builds_here(cpu_route):
    assert unavailable_reason() is None  # CI machines have a C compiler: the fast path must not silently vanish
    assert build.isa(build.load("cpu_prefill_attention")[0]) == cpu_route


# lengths cross the kernel's row tiles (64 // group rows), key tiles (48) and cache blocks
Q_LENS = [1, 5, 22, 48, 49, 130, 300]
PREFIXES = [0, 17, 0, 16, 100, 0, 333]


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 64), (8, 1, 128), (16, 2, 32), (64, 1, 16)])
@pytest.mark.parametrize("bs", [16, 8])
def test_matches_reference(heads, kv_heads, d, bs, cpu_route):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case(Q_LENS, PREFIXES, heads, kv_heads, d, bs)
    args = (q, k, v, cu, cu, d ** -0.5, True, k_cache, v_cache, tables, prefix)
    got = prefill_attention_cpu(PrefillArgs(*args))
    torch.testing.assert_close(got, prefill_attention_ref(PrefillArgs(*args)), rtol=0, atol=2e-5)
    prepared = prepare_tables(cu, cu, prefix, tables, k_cache.shape[:2])  # what the engine does once per step
    torch.testing.assert_close(prefill_attention_cpu(PrefillArgs(*args, plan=prepared)), got)


def test_without_a_prefix_and_without_causality(cpu_route):
    q, k, v, cu, *_ = varlen_case([3, 70, 129], [0, 0, 0], 6, 2, 64)
    for causal in (True, False):
        args = PrefillArgs(q, k, v, cu, cu, 0.125, causal)
        torch.testing.assert_close(prefill_attention_cpu(args), prefill_attention_ref(args), rtol=0, atol=2e-5)


def test_reads_only_its_own_blocks_and_prefix(cpu_route):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([7, 40], [20, 33], 6, 2, 64)
    args = PrefillArgs(q, k, v, cu, cu, 0.125, True, k_cache, v_cache, tables, prefix)
    before = prefill_attention_cpu(args)
    used = set(tables[0, :2].tolist()) | set(tables[1, :3].tolist())
    for blk in set(range(k_cache.shape[0])) - used:  # blocks nobody owns
        k_cache[blk] = float("nan")
        v_cache[blk] = float("nan")
    k_cache[tables[0, 1], 4:] = float("nan")  # past sequence 0's 20-token prefix: its new rows come from k/v
    v_cache[tables[1, 2], 1:] = float("nan")
    torch.testing.assert_close(prefill_attention_cpu(args), before)


def test_bad_inputs_raise_instead_of_reading_stray_memory(cpu_route):
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case([7, 40], [20, 33], 6, 2, 64)
    zeros = torch.zeros(2, dtype=torch.int32)
    cases = {  # (cu_seqlens_k, prefix_lens, block_tables, rows of k and v)
        "prefix past its table": (cu, torch.tensor([20, 33 + 16], dtype=torch.int32), tables, 47),
        "block id past the cache": (cu, prefix, tables + k_cache.shape[0], 47),
        "offsets that miss rows": (cu, prefix, tables, 46),
        "more queries than keys": (torch.tensor([0, 5, 47], dtype=torch.int32), zeros, tables, 47),
    }
    for what, (cu_k, pre, tab, rows) in cases.items():
        kv = torch.randn(rows, *k.shape[1:])
        with pytest.raises(ValueError):
            prefill_attention_cpu(PrefillArgs(q, kv, kv, cu, cu_k, 0.1, True, k_cache, v_cache, tab, pre))
            pytest.fail(what)
    with pytest.raises(ValueError, match="unsupported"):
        prefill_attention_cpu(PrefillArgs(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, cu, 0.1))
    prepared = prepare_tables(cu, cu, prefix, tables, k_cache.shape[:2])
    with pytest.raises(ValueError, match="another cache"):  # a plan only holds for the cache it was checked on
        prefill_attention_cpu(PrefillArgs(q, k, v, cu, cu, 0.1, True, k_cache[:-1], v_cache[:-1], tables, prefix,
                                          plan=prepared))
    with pytest.raises(ValueError, match="do not describe"):  # nor for other rows
        prefill_attention_cpu(PrefillArgs(q[:-1], k[:-1], v[:-1], cu, cu, 0.1, True, k_cache, v_cache, tables, prefix,
                                          plan=prepared))


def test_shapes_the_kernel_does_not_take_run_the_reference(monkeypatch):
    q, k, v, cu, *_ = varlen_case([5, 30], [0, 0], 6, 3, 12)  # head_dim 12: not a multiple of 16
    assert not supports(q, k) and not supports(q.bfloat16(), k.bfloat16())
    backend = select_backend("torch", torch.device("cpu"))
    assert isinstance(backend, CpuBackend) and backend.c_prefill
    assert "C prefill and paged decode attention" in backend.describe()
    kernel_calls = []
    monkeypatch.setattr(cpu_prefill, "prefill_attention_cpu",
                        lambda args: kernel_calls.append(args) or prefill_attention_cpu(args))
    args = PrefillArgs(q, k, v, cu, cu, 0.3, True)
    torch.testing.assert_close(backend.prefill(args), prefill_attention_ref(args), rtol=0, atol=0)
    assert kernel_calls == []  # the reference ran
    q16, k16, v16, cu16, *_ = varlen_case([5, 30], [0, 0], 6, 3, 16)
    backend.prefill(PrefillArgs(q16, k16, v16, cu16, cu16, 0.3, True))
    assert len(kernel_calls) == 1  # a shape the kernel takes goes to the kernel
    assert type(select_backend("torch", torch.device("cpu"), torch.bfloat16)) is TorchBackend


def test_the_engine_plans_a_step_once_for_all_layers(monkeypatch):
    from runtime.sampling_params import SamplingParams
    from tests.tiny_engine import tiny_engine

    engine = tiny_engine()
    backend = engine.model_runner.model.backend
    assert isinstance(backend, CpuBackend) and backend.c_prefill
    calls, plans = [], []
    monkeypatch.setattr(cpu_prefill, "prepare_tables", lambda *args: calls.append(1) or prepare_tables(*args))
    monkeypatch.setattr(cpu_prefill, "prefill_attention_cpu",
                        lambda args: plans.append(args.plan) or prefill_attention_cpu(args))
    engine.add_request("a", list(range(3, 40)), SamplingParams(temperature=0, max_tokens=2))
    engine.add_request("b", list(range(5, 25)), SamplingParams(temperature=0, max_tokens=2))
    engine.step()  # both prompts in one prefill step through every layer
    assert len(engine.model_runner.model.layers) > 1 and len(calls) == 1
    assert len(plans) == len(engine.model_runner.model.layers) and all(plan is plans[0] for plan in plans)


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 1, 128), (64, 1, 16)])
def test_a_bf16_prefix_reads_as_its_widened_fp32_copy(heads, kv_heads, d, cpu_route):
    """The prefix's bf16 rows are widened (exactly) into scratch before the fp32 tiles: bit for bit the
    fp32 kernel on cache.float(); against the reference on the rounded cache, the fp32 tolerance above."""
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case(Q_LENS, PREFIXES, heads, kv_heads, d)
    k16, v16 = k_cache.bfloat16(), v_cache.bfloat16()
    head = (q, k, v, cu, cu, d ** -0.5, True)
    got = prefill_attention_cpu(PrefillArgs(*head, k16, v16, tables, prefix), "fp32")  # bf16: its own tests
    assert torch.equal(got, prefill_attention_cpu(PrefillArgs(*head, k16.float(), v16.float(), tables, prefix)))
    want = prefill_attention_ref(PrefillArgs(*head, k16.float(), v16.float(), tables, prefix))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    torch.testing.assert_close(prefill_attention_ref(PrefillArgs(*head, k16, v16, tables, prefix)), want,
                               rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 1, 128)])
def test_an_8bit_prefix_reads_as_its_dequantized_copy(dtype, heads, kv_heads, d, cpu_route):
    """The prefix's 8-bit rows become stored * scale (its KV head's) in scratch before the fp32 tiles:
    bit for bit the fp32 kernel on the dequantized cache; against the reference reading the same bytes,
    the fp32 tolerance above (summation order only)."""
    q, k, v, cu, k_cache, v_cache, tables, prefix = varlen_case(Q_LENS, PREFIXES, heads, kv_heads, d)
    (k8, ks), (v8, vs) = quantized(k_cache, dtype), quantized(v_cache, dtype)
    head, scales = (q, k, v, cu, cu, d ** -0.5, True), KVScales(ks, vs)
    got = prefill_attention_cpu(PrefillArgs(*head, k8, v8, tables, prefix, kv_scales=scales), "fp32")
    k32, v32 = dequantize(k8, ks), dequantize(v8, vs)
    assert torch.equal(got, prefill_attention_cpu(PrefillArgs(*head, k32, v32, tables, prefix)))
    want = prefill_attention_ref(PrefillArgs(*head, k8, v8, tables, prefix, kv_scales=scales))
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    torch.testing.assert_close(prefill_attention_ref(PrefillArgs(*head, k32, v32, tables, prefix)), want,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="needs its k/v scales"):
        prefill_attention_cpu(PrefillArgs(*head, k8, v8, tables, prefix))
