"""A GGUF's blocks under tensor and pipeline parallelism: each rank keeps its share of the file's bytes (rows whole,
input columns cut on block boundaries), runs the same block kernels as one process, and a size whose
split would cut a block is refused before any rank starts."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.build import build_engine
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.parallel.plan import rank_shard
from runtime.parallel.shard import shard_checkpoint
from runtime.sampling_params import SamplingParams
from tests.model_files import tiny_config, write_tiny_gguf
from tests.runtime.parallel.test_tensor_parallel import PROMPTS, assert_same_until_a_near_tie, tokens
from tests.tiny_engine import byte_tokenizer
from weights.load import load_checkpoint
from weights.quantized import QuantizedTensor

# o_proj's 64 input columns per rank and down's 128 are whole Q4_1 blocks (32 values)
SHAPE = dict(hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, head_dim=32, vocab_size=260)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)


def engine(path: str, **config):
    ck = load_checkpoint(path, keep_quantized=True)
    econf = EngineConfig(device="cpu", backend="torch", kv_cache_memory=8 << 20, log_ledger=False, **config)
    return build_engine(econf, ck.config, ck.tensors, byte_tokenizer())


@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)])
def test_ranks_keep_the_blocks_and_match_one_process(tmp_path, layout):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, qtype="Q4_1", tensor_types={"token_embd.weight": "Q8_0"}, **SHAPE)
    with engine(path) as one, engine(path, **layout) as two:
        assert one.ledger.quantization.startswith("Q4_1 x")
        assert two.ledger.quantization.startswith("Q4_1 x")  # rank 0 did not fall back to float32
        assert "float32" not in two.ledger.quantization
        assert two.ledger.weight_bytes < 0.6 * one.ledger.weight_bytes  # norms replicated, blocks halved (or a stage's)
        want = LLM.from_engine(one).generate(PROMPTS, GREEDY, use_tqdm=False)
        assert_same_until_a_near_tie(tokens(two, PROMPTS, dataclasses.replace(GREEDY, logprobs=None)), want)


def test_rank_shards_are_the_files_blocks():
    cfg = tiny_config(**SHAPE)
    down = QuantizedTensor("Q4_1", torch.randint(0, 255, (128, 256 // 32 * 20), dtype=torch.uint8), 256)
    q = QuantizedTensor("Q4_1", torch.randint(0, 255, (128, 128 // 32 * 20), dtype=torch.uint8), 128)
    full = {"model.layers.0.mlp.down_proj.weight": down, "model.layers.0.self_attn.q_proj.weight": q}
    parts = [shard_checkpoint(cfg, full, rank_shard(cfg, r, 2)) for r in range(2)]
    assert torch.equal(torch.cat([p["model.layers.0.mlp.down_proj.weight"].blocks for p in parts], 1), down.blocks)
    assert torch.equal(torch.cat([p["model.layers.0.self_attn.q_proj.weight"].blocks for p in parts]), q.blocks)
    assert parts[1]["model.layers.0.mlp.down_proj.weight"].shape == (128, 128)


def test_a_split_that_cuts_a_block_is_a_user_error():
    cfg = tiny_config(**SHAPE)  # 4 heads of 32: a rank's 64 o_proj columns are a quarter of a Q4_K super-block
    o = QuantizedTensor("Q4_K", torch.zeros((128, 144 // 2), dtype=torch.uint8), 128)
    with pytest.raises(UserError, match=r"o_proj.weight: its Q4_K blocks hold 256 values.*\[0, 64\)"):
        shard_checkpoint(cfg, {"model.layers.0.self_attn.o_proj.weight": o}, rank_shard(cfg, 0, 2))
