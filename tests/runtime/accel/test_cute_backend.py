"""The cute backend's wiring, on the CPU: the paged decode kernel's plan made once per step (and, for a
CUDA graph, over the static buffers with a fixed split count), and the references for inputs no kernel
takes."""
from __future__ import annotations

import pytest
import torch

from cute_kernels import reference
from cute_kernels.hopper.decode.decode_host import DecodePlan
from cute_kernels.hopper.decode.decode_spec import num_splits
from runtime.accel.cuda_graphs import StaticDecodeInputs
from runtime.accel.cute_backend import CuteBackend
from runtime.model.attention_batch import AttentionBatch


def decode_batch() -> AttentionBatch:
    return AttentionBatch(torch.zeros(2, dtype=torch.int64), 8, 16, num_kv_heads=2, num_decode_tokens=2,
                          decode_block_tables=torch.tensor([[3, 1], [5, 0]], dtype=torch.int32),
                          decode_context_lens=torch.tensor([20, 7], dtype=torch.int32))


def test_the_decode_kernel_plans_once_per_step():
    backend = CuteBackend()
    assert backend.describe().endswith("; decode")
    batch = decode_batch()
    backend.plan(batch)
    assert isinstance(batch.decode_plan, DecodePlan) and batch.decode_plan.num_blocks == 8
    first = batch.decode_plan
    backend.plan(batch)
    assert batch.decode_plan is first, "every layer of the step shares one plan"


def test_a_graph_plan_reads_the_static_buffers_with_a_fixed_split_count():
    inputs = StaticDecodeInputs.allocate(rows=4, width=8, scratch_block=9, block_size=16, device=torch.device("cpu"))
    plan = CuteBackend().graph_decode_plan(inputs.batch(4, num_blocks=10, num_kv_heads=2), max_context=128)
    assert plan.block_tables.data_ptr() == inputs.block_tables.data_ptr(), "replays see the refilled tables"
    assert plan.context_lens.data_ptr() == inputs.context_lens.data_ptr()
    assert plan.num_splits == num_splits(4, 2, 128)


def test_inputs_no_kernel_takes_run_the_references():
    """fp32 and CPU tensors never reach a kernel (the kernels' host code would refuse them)."""
    backend = CuteBackend()
    x, w = torch.randn(3, 64), torch.rand(64)
    h, res = backend.add_rms_norm(x, None, w, 1e-5)
    torch.testing.assert_close(h, reference.add_rms_norm_ref(x, None, w, 1e-5)[0])
    gate_up = torch.randn(2, 32, dtype=torch.bfloat16)
    torch.testing.assert_close(backend.silu_and_mul(gate_up), reference.silu_and_mul_ref(gate_up))


def test_deterministic_decode_takes_one_split_whatever_the_batch():
    """--deterministic: a row's keys reduce in one CTA in tile order; split counts that follow the batch
    (here 2 rows of a long context would split) would make its bits depend on its batch mates."""
    backend = CuteBackend()
    backend.batch_invariant = True
    batch = decode_batch()
    batch.decode_context_lens = torch.tensor([4000, 7], dtype=torch.int32)
    batch.decode_block_tables = torch.zeros(2, 250, dtype=torch.int32)
    assert num_splits(2, 2, 4000) > 1
    backend.plan(batch)
    assert batch.decode_plan.num_splits == 1
    inputs = StaticDecodeInputs.allocate(rows=4, width=8, scratch_block=9, block_size=16, device=torch.device("cpu"))
    assert backend.graph_decode_plan(inputs.batch(4, num_blocks=10, num_kv_heads=2), max_context=128).num_splits == 1


def test_an_e4m3_cache_reaches_the_kernels_with_its_scales(monkeypatch):
    """Through AttentionBackend.attention: the quantizing write gets the layer's scales, decode and
    prefill args carry them, and the prefill's new keys are rounded as the cache stores them."""
    from types import SimpleNamespace

    from cute_kernels.kv_e4m3 import dequantize_e4m3, quantize_e4m3
    from cute_kernels.kv_quant import KVScales

    seen = {}
    backend = CuteBackend()
    backend._fused = SimpleNamespace(write_kv=lambda *a: seen.setdefault("write", a))
    backend._decode_host = SimpleNamespace(decode_attention=lambda args: seen.setdefault("decode", args).q)
    monkeypatch.setattr(backend, "prefill", lambda args: seen.setdefault("prefill", args).q)
    k_cache, v_cache = (torch.zeros(8, 16, 2, 64, dtype=torch.float8_e4m3fn) for _ in range(2))
    ks, vs = torch.tensor([0.01, 0.02]), torch.tensor([0.03, 0.04])
    batch = AttentionBatch(torch.arange(3), 8, 16, num_kv_heads=2, num_decode_tokens=1,
                           decode_block_tables=torch.tensor([[3]], dtype=torch.int32),
                           decode_context_lens=torch.tensor([5], dtype=torch.int32),
                           cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32), max_seqlen_q=2)
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    backend.attention(q, k, v, k_cache, v_cache, batch, 0.125, KVScales(ks, vs))
    assert seen["write"][-2:] == (ks, vs)
    assert seen["decode"].kv_scales.k is ks and seen["prefill"].kv_scales.v is vs
    torch.testing.assert_close(seen["prefill"].k, dequantize_e4m3(quantize_e4m3(k[1:], ks), ks))


def test_an_e4m3_write_never_falls_back_to_a_reference():
    from cute_kernels.kv_quant import KVScales

    k_cache = torch.zeros(2, 16, 2, 64, dtype=torch.float8_e4m3fn)
    k = torch.randn(1, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):  # refused on the CPU, not done by a reference
        CuteBackend().write_kv(k, k, k_cache, k_cache, torch.zeros(1, dtype=torch.int64),
                               KVScales(torch.ones(2), torch.ones(2)))
