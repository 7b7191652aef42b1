"""A GGUF's block-quantized weights kept quantized in the model (the default), the float path
(--quantization none), and float weights quantized at load (int8, q4).

Tolerances: the C kernel and its torch reference differ only in float32 summation order (see
test_cpu_quant_gemm.py), but inside a model such a difference can flip the int8 rounding of an
activation in a later layer (one step is 1/254 of its block's largest value), so whole-model logits
are compared by relative error (0.5%; a wrong block or scale gives O(1)). Against the float path the
int8 rounding of activations (<= 0.4% of each block's largest value) and, for int8/q4, of weights
moves logits by ~1% (q4 on these random weights: ~9%); the bounds are 2-5x what these seeds show.
The AMX path (a 40-row prefill chunk, where the host has the tiles) rounds activations and dequantized
weights to bf16 (2^-9 relative) instead: its last hidden state lands 0.41-0.48% from the float path's on
these seeds, against 0.92-1.17% for the int8 path, so it is held to 0.75% of the float path rather than
to the int8 reference; a chunk whose every row is sampled is a verify chunk, whose rows keep the int8
route (runtime/model/step_rows.py), so that test samples only the last row.
"""
from types import SimpleNamespace

import pytest
import torch

from cute_kernels.cpu import quant_amx, quant_gemm
from runtime.accel.block_linear import BlockQuantEmbedding, BlockQuantLinear, hand_glu_rows_to_down
from runtime.accel.quantization import unavailable_reason
from runtime.build import make_runner
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.model.linear import DenseLinear
from runtime.sequence import SeqChunk
from tests.cute_kernels.cpu.test_cpu_quant_gemm import gguf_blocks
from tests.hf_tiny import our_config, state_dict, tiny_hf_model
from tests.model_files import write_tiny_gguf
from tests.tiny_engine import tiny_engine
from weights.load import load_checkpoint
from weights.quantized import QuantizedTensor

IDS = torch.randint(0, 120, (40,), generator=torch.Generator().manual_seed(4)).tolist()


def logits(cfg, tensors, quantization):
    runner, ledger = make_runner(cfg, tensors, 4 << 20, backend="torch", quantization=quantization)
    return runner.run([SeqChunk(IDS, 0, list(range(3)), num_logits=len(IDS))]), runner.model, ledger


def last_hidden(cfg, tensors, quantization):
    """The final hidden state of a prefill chunk's last row (the body's product, before the LM head)."""
    runner, _ = make_runner(cfg, tensors, 4 << 20, backend="torch", quantization=quantization)
    runner.run([SeqChunk(IDS, 0, list(range(3)), num_logits=1)])
    return runner.hidden


def gguf_tensors(tmp_path, qtype):
    path = str(tmp_path / f"m-{qtype}.gguf")
    write_tiny_gguf(path, qtype=qtype, tensor_types={"token_embd.weight": "Q8_0"})
    return lambda: (lambda ck: (ck.config, ck.tensors))(load_checkpoint(path, keep_quantized=True))


def relative_error(got, want):
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_stay_quantized_and_match_the_float_path(tmp_path, qtype):
    load = gguf_tensors(tmp_path, qtype)
    cfg, tensors = load()
    assert isinstance(tensors["model.layers.0.mlp.down_proj.weight"], QuantizedTensor)
    quantized, model, ledger = logits(cfg, tensors, None)
    assert all(isinstance(linear, BlockQuantLinear) for linear in model.linears())
    assert isinstance(model.embedding, BlockQuantEmbedding)
    assert model.quantization().startswith(f"{qtype} x ") and f"({model.quantization()})" in ledger.describe()
    float_logits, float_model, float_ledger = logits(*load(), "none")
    assert float_model.quantization() == f"float32 x {len(model.linears())}"
    assert ledger.weight_bytes * 2.5 < float_ledger.weight_bytes
    assert relative_error(quantized, float_logits) < (0.02 if qtype == "Q8_0" else 0.05)


def test_kernel_and_reference_agree_inside_the_model(tmp_path, monkeypatch):
    load = gguf_tensors(tmp_path, "Q4_1")
    monkeypatch.setattr(quant_amx, "available", lambda: False)
    kernel = logits(*load(), None)[0]
    monkeypatch.setattr(quant_gemm, "_library", lambda flags=(): (None, "off for this test"))
    reference = logits(*load(), None)[0]
    assert relative_error(kernel, reference) < 0.005


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_amx_tiles_inside_the_model_stay_near_the_float_path(tmp_path, qtype):
    if not quant_amx.available():
        pytest.skip("this CPU or build has no AMX-BF16 tiles")
    load = gguf_tensors(tmp_path, qtype)
    cfg, tensors = load()
    assert quant_gemm.choose_path(f"{qtype}_R8", len(IDS)) == "amx"
    assert relative_error(last_hidden(cfg, tensors, None), last_hidden(*load(), "none")) < 0.0075


def test_the_joined_gate_up_pass_gives_the_models_bits(tmp_path, monkeypatch):
    """A prefill chunk on the AMX tiles runs gate/up and SiLU in one pass (BlockQuantLinear.silu_and_mul):
    the same logits, bit for bit, as the linear and silu_and_mul apart."""
    if not quant_amx.available():
        pytest.skip("this CPU or build has no AMX-BF16 tiles")
    load = gguf_tensors(tmp_path, "Q4_1")
    joined = last_hidden(*load(), None)
    monkeypatch.setattr(BlockQuantLinear, "silu_and_mul", lambda self, x: None)
    assert torch.equal(joined, last_hidden(*load(), None))


def test_quantized_embedding_rows_are_the_dequantized_table(tmp_path):
    cfg, tensors = gguf_tensors(tmp_path, "Q4_1")()
    table = tensors["model.embed_tokens.weight"]
    ids = torch.tensor([[0, 5], [255, 5]])
    rows = BlockQuantEmbedding(table.type_name, table.blocks, table.cols)(ids)
    assert torch.equal(rows, table.dequantize()[ids])


@pytest.mark.parametrize("mode,bound", [("int8", 0.03), ("q4", 0.25)])
def test_float_weights_quantized_at_load(mode, bound):
    hf = tiny_hf_model("qwen2")  # with q/k/v biases
    cfg = our_config(hf, "qwen2")
    quantized, model, ledger = logits(cfg, state_dict(hf), mode)
    float_logits, _, float_ledger = logits(cfg, state_dict(hf), None)
    head = {"q4": "int8"}.get(mode, mode)  # q4 keeps the LM head in int8
    assert model.quantization() == (f"{mode} x {len(model.linears())}" if head == mode
                                    else f"{mode} x {len(model.linears()) - 1}, {head} x 1")
    assert ledger.weight_bytes < float_ledger.weight_bytes
    assert relative_error(quantized, float_logits) < bound


def test_engine_runs_a_mode_and_rejects_what_it_cannot_run():
    engine = tiny_engine(quantization="q4")
    assert "(q4 x 8, int8 x 1)" in engine.ledger.describe()  # 2 layers x 4 linears; the LM head in int8
    assert engine.describe()["weights"].startswith("q4 x 8, int8 x 1, ")  # the About panel's line
    with pytest.raises(UserError, match="unknown quantization"):
        EngineConfig(quantization="fp3")
    assert "CPU only" in unavailable_reason("int8", torch.device("cuda"))
    assert unavailable_reason(None, torch.device("cuda")) is None and unavailable_reason("none", torch.device("cuda")) is None


def test_only_a_block_quantized_down_is_handed_bf16_rows():
    """hand_glu_rows_to_down marks a layer's gate/up only where its down reads bf16 rows (BlockQuantLinear.__call__);
    a float down would be handed rows it cannot take."""
    def q4(rows: int) -> BlockQuantLinear:
        return BlockQuantLinear("Q4_1", gguf_blocks(torch.randn(rows, 32), "Q4_1"))

    pairs = [(q4(64), q4(32)), (q4(64), DenseLinear(torch.randn(32, 32)))]
    layers = [SimpleNamespace(gate_up=gate_up, down=down) for gate_up, down in pairs]
    hand_glu_rows_to_down(layers)
    assert [layer.gate_up.rows_for_down for layer in layers] == [True, False]
