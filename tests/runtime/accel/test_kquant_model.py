"""A GGUF holding K-quants, mixed as llama.cpp's Q4_K_M / Q5_K_M files mix them (Q4_K q/k beside a
Q6_K v, Q5_K down, a Q6_K token table read by the tied head too), keeps them quantized in the model;
--quantization none is the float path on the same values.

Tolerance against the float path: both compute on the same dequantized weights, so only the int8
rounding of activations (<= 0.4% of each 32-block's largest value) separates them; on this random
model it moves logits by at most ~0.07 (they span about +-3). A misread block moves them by O(1).
"""
import pytest
import torch

from runtime.accel.block_linear import BlockQuantEmbedding, BlockQuantLinear, BlockQuantParts
from runtime.build import make_runner
from runtime.sequence import SeqChunk
from tests.model_files import write_tiny_gguf
from weights.load import load_checkpoint
from weights.quantized import QuantizedTensor

SHAPE = dict(hidden_size=256, intermediate_size=512, head_dim=64)  # rows of whole 256-value super-blocks
TYPES = {"token_embd.weight": "Q6_K", "blk.0.attn_v.weight": "Q6_K", "blk.1.ffn_down.weight": "Q5_K"}
PROMPT = [1, 5, 9, 77, 200, 31, 4, 8]
LOGIT_TOL = 0.2
BLOCKS = list(range(4))


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("kquant") / "m.gguf")
    stored = write_tiny_gguf(path, qtype="Q4_K", tensor_types=TYPES, skip_tensors={"output.weight"}, **SHAPE)
    return path, stored


def runner(path, quantization):
    ck = load_checkpoint(path, keep_quantized=True)
    return make_runner(ck.config, ck.tensors, 4 << 20, backend="torch", quantization=quantization)


def test_blocks_load_quantized_and_as_float(gguf_path):
    path, stored = gguf_path
    tensors = load_checkpoint(path, keep_quantized=True).tensors
    down = tensors["model.layers.1.mlp.down_proj.weight"]
    assert isinstance(down, QuantizedTensor) and down.type_name == "Q5_K"
    assert tensors["model.embed_tokens.weight"].type_name == "Q6_K"
    for name, values in load_checkpoint(path).tensors.items():  # the float load: gguf's own values
        assert torch.equal(values, stored[name]), name


def test_model_keeps_k_quants_and_shows_them(gguf_path):
    (quantized, ledger), (floats, float_ledger) = runner(gguf_path[0], None), runner(gguf_path[0], "none")
    model = quantized.model
    assert isinstance(model.embedding, BlockQuantEmbedding) and model.embedding.type_name == "Q6_K"
    assert isinstance(model.head, BlockQuantLinear) and model.head.blocks is model.embedding.blocks  # tied
    qkv0 = model.layers[0].qkv
    assert isinstance(qkv0, BlockQuantParts) and [p.type_name for p in qkv0.parts] == ["Q4_K", "Q6_K"]
    summary = "Q4_K x 6, Q4_K+Q6_K x 1, Q5_K x 1, Q6_K x 1"  # 2 layers x 4 linears and the tied head
    assert model.quantization() == summary and f"({summary})" in ledger.describe()
    assert floats.model.quantization() == "float32 x 9"
    assert ledger.weight_bytes * 4 < float_ledger.weight_bytes


def decode(runner, steps: int, forced: list[int] | None = None) -> tuple[list[int], torch.Tensor]:
    """PROMPT as one chunk, then one token per decode step (GEMV rows): greedy, or `forced` tokens.
    Returns the tokens fed after the prompt and the logits of every step [steps, vocab]."""
    tokens = list(PROMPT)
    logits = [runner.run([SeqChunk(tokens, 0, BLOCKS)])[-1]]
    for i in range(steps - 1):
        tokens.append(forced[i] if forced else int(logits[-1].argmax()))
        logits.append(runner.run([SeqChunk(tokens[-1:], len(tokens) - 1, BLOCKS)])[-1])
    return tokens[len(PROMPT):], torch.stack(logits)


def test_greedy_tokens_follow_the_float_path(gguf_path):
    """The float path's greedy continuation, teacher-forced through both: every logit within LOGIT_TOL,
    and the quantized argmax is the float one wherever the float top-2 gap leaves room (> 2 LOGIT_TOL)."""
    floats, quantized = runner(gguf_path[0], "none")[0], runner(gguf_path[0], None)[0]
    tokens, want = decode(floats, 12)
    got = decode(quantized, 12, forced=tokens)[1]
    assert (got - want).abs().max() < LOGIT_TOL
    gap = want.topk(2).values.diff().abs().squeeze(1)
    clear = gap > 2 * LOGIT_TOL
    assert clear.sum() >= 3 and torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_embedding_rows_are_the_dequantized_table(gguf_path):
    table = load_checkpoint(gguf_path[0], keep_quantized=True).tensors["model.embed_tokens.weight"]
    ids = torch.tensor([[0, 5], [255, 5]])
    rows = BlockQuantEmbedding(table.type_name, table.blocks, table.cols)(ids)
    assert torch.equal(rows, table.dequantize()[ids])
