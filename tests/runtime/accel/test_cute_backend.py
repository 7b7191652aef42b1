"""The cute backend's wiring, on the CPU: the paged decode kernel's plan made once per step (and, for a
CUDA graph, over the static buffers with a fixed split count), and the references for inputs no kernel
takes."""
from __future__ import annotations

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
