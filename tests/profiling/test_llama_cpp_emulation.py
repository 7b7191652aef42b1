"""profiling/quality/llama_cpp_emulation.py: with the engine's own arithmetic it reproduces the engine's logits on a
tiny Q4_1 GGUF (so the rows of its table that add llama.cpp's roundings differ from the engine by those
roundings alone), each rounding switch takes effect, and its activation blocks are the engine's reference's."""
from dataclasses import replace

import pytest
import torch

from cute_kernels.cpu.quant_reference import quantize_activations_ref
from profiling.quality import llama_cpp_emulation as emulation
from profiling.quality.quant_quality import all_logits, top1_agreement
from runtime.engine_config import FLOAT_MODE
from tests.model_files import write_tiny_gguf
from weights.load import load_checkpoint

IDS = [(7 * i + 3) % 64 for i in range(40)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("emulation") / "tiny-q4_1.gguf")
    write_tiny_gguf(path, qtype="Q4_1")
    ck = load_checkpoint(path, keep_quantized=True)
    return ck.config, ck.tensors, emulation.Emulation(ck.config, ck.tensors)


@pytest.mark.parametrize("quantization,arithmetic", [(None, emulation.NONE),
                                                     (FLOAT_MODE, replace(emulation.NONE, activations="float"))])
def test_the_engines_arithmetic_reproduces_the_engines_logits(tiny, quantization, arithmetic):
    cfg, tensors, em = tiny
    engine = all_logits(cfg, tensors, quantization, IDS)
    # the engine's float32 sums against float64's: 2e-7 and 6e-7 of 1.47 measured; 1e-4 of the largest logit
    # leaves room for an activation that lands on a rounding boundary on another CPU's order of sums, while
    # int8 activations or an f16 KV cache move these logits by 1.6e-2 and 1.9e-2, leaving out the rope by 0.13
    scale = engine.abs().max().item()
    torch.testing.assert_close(em.logits(IDS, arithmetic), engine, rtol=0, atol=1e-4 * scale)


def test_each_of_llama_cpps_roundings_changes_the_logits(tiny):
    _, _, em = tiny
    base = em.logits(IDS, emulation.NONE)
    for name in ("kv_f16", "q_f16", "probs_f16"):
        assert not torch.equal(em.logits(IDS, replace(emulation.NONE, **{name: True})), base), name
    assert not torch.equal(em.logits(IDS, replace(emulation.NONE, activations="q8_1")), base)
    # the tiny model's 64-wide rows and 40 positions round alike either way: the real model's shapes
    x = torch.randn(16, 576, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 576)
    norms = [emulation.rms_norm(x, torch.ones(576), 1e-5, in_double) for in_double in (False, True)]
    assert not torch.equal(*norms)
    tables = [emulation.rope_tables(512, 64, 100000.0, ggml) for ggml in (False, True)]
    assert not torch.equal(tables[0][0], tables[1][0])
    torch.testing.assert_close(tables[0][0], tables[1][0], rtol=0, atol=1e-3)  # the same angles, rounded apart


def test_activation_blocks_are_the_engine_references_and_s_rounds_as_ggml():
    x = torch.randn(4, 96) * torch.logspace(-2, 2, 96)
    scaled, s = emulation.quantize_blocks(x, "q8_d16")
    q, d, s_ref = quantize_activations_ref(x)
    assert torch.equal(scaled, (q.double().reshape(4, 3, 32) * d.double().unsqueeze(2)).reshape(4, 96))
    assert torch.equal(s, s_ref.double())
    _, s_ggml = emulation.quantize_blocks(x, "q8_1")  # fp16(d * sum(q)) with d before its fp16 rounding
    d32 = x.reshape(4, 3, 32).abs().amax(dim=2) / 127.0
    assert torch.equal(s_ggml, (d32 * q.reshape(4, 3, 32).float().sum(dim=2)).half().double())


def test_top1_agreement_leaves_out_near_ties_only_when_asked():
    ref = torch.tensor([[2.0, 1.9, 0.0], [3.0, 0.0, 0.0], [0.0, 5.0, 1.0]])
    ours = torch.tensor([[1.9, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 4.0, 1.0]])
    assert top1_agreement(ours, ref) == pytest.approx(2 / 3)
    assert top1_agreement(ours, ref, margin=0.5) == 1.0
