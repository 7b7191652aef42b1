"""A GGUF mixing Q5_0/Q5_1 with K-quants, as llama.cpp's Q4_K_M / Q5_K_M files of models whose rows are
not whole 256-value super-blocks do, loads quantized (a fused weight keeps each part's type) and
decodes as its float path does (--quantization none on the same values). Tolerance: see
tests/runtime/accel/test_kquant_model.py (the same random model shape and prompt).
"""
import pytest
import torch

from runtime.accel.block_linear import BlockQuantParts
from tests.model_files import write_tiny_gguf
from tests.runtime.accel.test_kquant_model import LOGIT_TOL, SHAPE, decode, runner
from weights.load import load_checkpoint
from weights.quantized import QuantizedTensor

TYPES = {"token_embd.weight": "Q6_K", "blk.0.attn_v.weight": "Q5_0", "blk.0.ffn_down.weight": "Q5_1",
         "blk.1.attn_k.weight": "Q5_1", "blk.1.ffn_gate.weight": "Q5_0", "blk.1.ffn_up.weight": "Q5_0"}


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("q5") / "m.gguf")
    stored = write_tiny_gguf(path, qtype="Q4_K", tensor_types=TYPES, skip_tensors={"output.weight"}, **SHAPE)
    return path, stored


def test_five_bit_blocks_load_quantized_and_as_float(gguf_path):
    path, stored = gguf_path
    tensors = load_checkpoint(path, keep_quantized=True).tensors
    for name, type_name in [("model.layers.0.self_attn.v_proj.weight", "Q5_0"),
                            ("model.layers.0.mlp.down_proj.weight", "Q5_1")]:
        assert isinstance(tensors[name], QuantizedTensor) and tensors[name].type_name == type_name
        assert torch.equal(tensors[name].dequantize(), stored[name])
    for name, values in load_checkpoint(path).tensors.items():  # the float load: gguf's own values
        assert torch.equal(values, stored[name]), name


def test_model_keeps_five_bit_parts_apart(gguf_path):
    model = runner(gguf_path[0], None)[0].model
    qkv0, qkv1 = model.layers[0].qkv, model.layers[1].qkv
    assert isinstance(qkv0, BlockQuantParts) and [p.type_name for p in qkv0.parts] == ["Q4_K", "Q5_0"]
    assert [p.type_name for p in qkv1.parts] == ["Q4_K", "Q5_1", "Q4_K"]
    assert model.layers[1].gate_up.type_name == "Q5_0" and model.layers[0].down.type_name == "Q5_1"
    assert runner(gguf_path[0], "none")[0].model.quantization() == "float32 x 9"


def test_greedy_decode_follows_the_float_path(gguf_path):
    """The float path's greedy continuation, teacher-forced through the quantized one: every logit
    within LOGIT_TOL, the same argmax wherever the float top-2 gap is over 2 LOGIT_TOL, and the
    quantized path's own greedy tokens the float ones up to the first step without such a gap."""
    floats, quantized = runner(gguf_path[0], "none")[0], runner(gguf_path[0], None)[0]
    tokens, want = decode(floats, 12)
    got = decode(quantized, 12, forced=tokens)[1]
    assert (got - want).abs().max() < LOGIT_TOL
    clear = want.topk(2).values.diff().abs().squeeze(1) > 2 * LOGIT_TOL
    assert clear.sum() >= 3 and torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    agree = int(clear.int().cumprod(0).sum())  # steps before the first close call
    assert decode(quantized, 12)[0][:agree] == tokens[:agree]
