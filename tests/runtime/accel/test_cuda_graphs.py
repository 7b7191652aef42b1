"""CUDA graphs for decode steps: bucketing and padding, the static input buffers, the sync-free decode
reference they replay, that the CPU never captures (CPU tests), and on a GPU (marker gpu) that a
replayed step equals the eager one, tokens and logits."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cute_kernels import reference
from cute_kernels.attention_args import DecodeArgs
from cute_kernels.reference_static import decode_attention_static_ref
from runtime.accel.cuda_graphs import (
    MAX_GRAPH_CONTEXT,
    GraphedRunner,
    StaticDecodeInputs,
    capture_sizes,
    padded_size,
    uses_graphs,
)
from runtime.engine_config import EngineConfig
from runtime.sampling_params import SamplingParams
from runtime.sequence import SeqChunk
from tests.hf_tiny import our_config, state_dict, tiny_hf_model
from tests.tiny_engine import TINY_VOCAB, byte_tokenizer, tiny_engine


def test_capture_sizes_double_up_to_max_num_seqs():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert capture_sizes(1) == [1]


def test_a_batch_pads_to_the_next_captured_size():
    sizes = capture_sizes(48)
    assert [padded_size(n, sizes) for n in (1, 3, 4, 5, 33, 48)] == [1, 4, 4, 8, 48, 48]
    assert padded_size(49, sizes) is None


def test_static_inputs_hold_the_step_then_padding_on_the_scratch_block():
    inputs = StaticDecodeInputs.allocate(rows=4, width=3, scratch_block=9, block_size=16, device=torch.device("cpu"))
    inputs.fill([SeqChunk([7], 20, [4, 2]), SeqChunk([8], 0, [5])])
    assert inputs.ids.tolist() == [7, 8, 0, 0] and inputs.positions.tolist() == [20, 0, 0, 0]
    assert inputs.slot_mapping.tolist() == [2 * 16 + 4, 5 * 16, 9 * 16, 9 * 16]
    assert inputs.context_lens.tolist() == [21, 1, 1, 1]
    assert inputs.block_tables.tolist() == [[4, 2, 9], [5, 9, 9], [9, 9, 9], [9, 9, 9]]
    inputs.fill([SeqChunk([3], 1, [6])])  # a smaller step leaves nothing of the last one behind
    assert inputs.ids.tolist() == [3, 0, 0, 0] and inputs.slot_mapping.tolist() == [6 * 16 + 1] + [9 * 16] * 3
    batch = inputs.batch(2, num_blocks=10, num_kv_heads=2)
    assert batch.num_decode_tokens == 2 and batch.decode_block_tables.shape == (2, 3)


def test_only_pure_decode_steps_that_fit_replay():
    backend = SimpleNamespace(graph_reads_full_tables=True)
    runner = SimpleNamespace(block_size=16, device=torch.device("cpu"), model=SimpleNamespace(backend=backend))
    graphs = GraphedRunner(runner, max_num_seqs=4, max_model_len=64, scratch_block=0)
    decode = [SeqChunk([1], 5, [1])] * 3
    assert not graphs.can_run(decode), "nothing captured yet"
    graphs.graphs = {4: None}
    assert graphs.can_run(decode)
    assert not graphs.can_run(decode * 2), "more rows than the largest graph"
    assert not graphs.can_run([SeqChunk([1, 2], 5, [1])]), "a prefill chunk"
    assert not graphs.can_run([SeqChunk([1], 5, [1], num_logits=0)])
    assert not graphs.can_run([SeqChunk([1], 5, list(range(5)))]), "a table wider than the buffers"
    capped = GraphedRunner(runner, max_num_seqs=4, max_model_len=10**5, scratch_block=0)
    assert capped.inputs.width * 16 == MAX_GRAPH_CONTEXT, "the full-width reference decode is capped"
    backend.graph_reads_full_tables = False
    assert GraphedRunner(runner, 4, 10**5, 0).inputs.width == -(-10**5 // 16), "a kernel reads each context only"


def test_static_decode_reference_matches_the_gathering_one():
    g = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(20, 16, 2, 64, generator=g), torch.randn(20, 16, 2, 64, generator=g)
    tables = torch.randperm(20, generator=g)[:12].view(3, 4).int()
    args = DecodeArgs(torch.randn(3, 6, 64, generator=g), k_cache, v_cache, tables,
                      torch.tensor([1, 17, 64], dtype=torch.int32), 0.125)
    torch.testing.assert_close(decode_attention_static_ref(args), reference.decode_attention_ref(args))


def test_the_static_step_equals_the_eager_step_on_the_cpu():
    """What a graph replays (static buffers, padding rows, the sync-free reference), run eagerly."""
    engine = tiny_engine()
    runner = engine.model_runner
    scratch = engine.pool.num_blocks - 1  # a block no sequence below uses
    chunks = [SeqChunk([65 + i], 3 + 5 * i, [i + 1]) for i in range(3)]
    for c in chunks:  # some context in the blocks first
        runner.run([SeqChunk(list(range(40, 40 + c.start_pos)), 0, c.block_table, num_logits=0)])
    eager = runner.run(chunks)
    graphs = GraphedRunner(runner, max_num_seqs=4, max_model_len=64, scratch_block=scratch)
    graphs.inputs.fill(chunks)
    static = graphs._forward(4)[:3]
    torch.testing.assert_close(static, eager, atol=1e-4, rtol=1e-4)


def test_the_cpu_never_captures():
    assert not uses_graphs(torch.device("cpu"), enforce_eager=False)
    assert not uses_graphs(torch.device("cuda"), enforce_eager=True)
    engine = tiny_engine()
    assert not isinstance(engine.runner, GraphedRunner) and engine.describe()["cuda graphs"] == "off"
    assert engine.pool.num_blocks == engine.ledger.num_blocks, "no scratch block taken"


# ---------------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu_tiny_engine(backend: str, enforce_eager: bool, kv_cache_dtype: str = "auto"):
    """A random 2-layer bf16 model in shapes the kernels take (head_dim 64, GQA 2:1), on CUDA."""
    from runtime.build import build_engine

    hf = tiny_hf_model("llama", seed=0, vocab_size=TINY_VOCAB, hidden_size=256, intermediate_size=512,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)
    config = EngineConfig(device="cuda", dtype="bfloat16", backend=backend, enforce_eager=enforce_eager,
                          max_num_seqs=8, kv_cache_memory=64 << 20, log_ledger=False, kv_cache_dtype=kv_cache_dtype)
    return build_engine(config, our_config(hf), state_dict(hf), byte_tokenizer())


def assert_e4m3_cache(engine) -> None:
    """Every layer's caches float8_e4m3fn on CUDA, its scales fp32 [kv_heads] there, the ledger's tokens
    twice a bf16 cache's under the same budget."""
    for layer, caches in zip(engine.model_runner.model.layers, engine.model_runner.kv_caches):
        assert all(c.dtype == torch.float8_e4m3fn and c.is_cuda for c in caches)
        for s in (layer.kv_scales.k, layer.kv_scales.v):
            assert s.dtype == torch.float32 and s.is_cuda and s.shape == (2,) and bool((s > 0).all())
    bf16_bytes = 2 * 2 * 64 * 2 * 2  # K and V, 2 KV heads, d 64, 2 bytes, 2 layers
    assert engine.ledger.kv_dtype == "float8_e4m3fn" and engine.ledger.bytes_per_token * 2 == bf16_bytes


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("backend,kv_cache_dtype", [("torch", "auto"), ("cute", "auto"), ("cute", "fp8_e4m3")])
def test_graph_replay_equals_eager_gpu(backend, kv_cache_dtype):
    """Same tiny bf16 model and prompts, graphs vs --enforce-eager: identical greedy tokens, and the
    replayed logits of one decode step equal the eager ones (same kernels; only padding rows differ).
    fp8_e4m3: the cache is e4m3 at half bf16's bytes, written by the quantizing kernel and read by the
    e4m3 decode / prefill variants with each layer's calibrated scales, in the graphs as eagerly."""
    if backend == "cute":
        from runtime.accel.cute_backend import unavailable_reason

        if unavailable_reason() is not None:
            pytest.skip(unavailable_reason())
    prompts = [[72, 105, 33] * (i + 1) for i in range(5)]

    def run(enforce_eager: bool):
        engine = gpu_tiny_engine(backend, enforce_eager, kv_cache_dtype)
        assert isinstance(engine.runner, GraphedRunner) != enforce_eager
        if kv_cache_dtype == "fp8_e4m3":
            assert_e4m3_cache(engine)
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        outs = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                outs[o.request_id] = o.outputs[0].token_ids
        chunks = [SeqChunk([5], 40, [1, 2, 3]), SeqChunk([6], 7, [4])]
        logits = engine.runner.forward(engine.runner.prepare(chunks)).clone()
        return outs, logits

    graph_tokens, graph_logits = run(False)
    eager_tokens, eager_logits = run(True)
    assert graph_tokens == eager_tokens
    torch.testing.assert_close(graph_logits, eager_logits, atol=2e-2, rtol=2e-2)
