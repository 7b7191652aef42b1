"""The --quantization fp8 model path on the CPU: the flag, the dequantizing Fp8Linear, the ledger's
weight bytes, and HF checkpoints stored in FP8 (a tiny synthetic one written here)."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from cute_kernels.fp8_quant import dequantize, quantize_activation_blocks, quantize_rowwise, quantize_weight_blocks
from runtime.accel.fp8_linear import Fp8Linear
from runtime.accel.quantization import quantize_linear
from runtime.engine_config import QUANTIZATION_MODES, EngineConfig
from runtime.errors import UserError


def test_flag_choices_and_bad_mode():
    assert "fp8" in QUANTIZATION_MODES
    assert EngineConfig(quantization="fp8").quantization == "fp8"
    with pytest.raises(UserError, match="quantization"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match="unknown quantization"):
        quantize_linear("int3", torch.zeros(4, 4), None)


def test_cli_lists_fp8():
    import argparse

    from runtime.engine_config import add_engine_args, config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert config_from_args(parser.parse_args(["--quantization", "fp8"])).quantization == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "int3"])


@pytest.mark.parametrize("block", [False, True])
def test_fp8_linear_is_the_w8a8_product(block):
    """The CPU path is activations quantized per token (or per 128 of K) times the e4m3 weight."""
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(96, 272, generator=g) * 0.1, torch.randn(96, generator=g)
    x = torch.randn(5, 3, 272, generator=g)
    layer = Fp8Linear.quantize(w, bias, block=block)
    out = layer(x)
    assert out.shape == (5, 3, 96) and layer.block_scaled == block
    rows = x.reshape(-1, 272)
    q, s = quantize_activation_blocks(rows) if block else quantize_rowwise(rows)
    expected = F.linear(dequantize(q, s), dequantize(layer.weight, layer.scale), bias)
    assert torch.allclose(out.reshape(-1, 96), expected, atol=1e-5)
    exact = F.linear(x, w, bias)
    assert (out - exact).norm() / exact.norm() < 0.05  # fp8 error, not a wrong product
    assert layer.weight_bytes() == 96 * 272 + layer.scale.numel() * 4 + 96 * 4


def test_fp8_linear_rejects_float_weights_and_bad_scales():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        Fp8Linear(torch.zeros(4, 16), torch.ones(4, 1))
    with pytest.raises(ValueError, match="scale mode"):
        Fp8Linear(torch.zeros(4, 16).to(torch.float8_e4m3fn), torch.ones(3, 3))


def _ledger_weight_bytes(quantization):
    from runtime.build import make_runner
    from tests.tiny_engine import tiny_weights

    cfg, tensors = tiny_weights()
    runner, ledger = make_runner(cfg, tensors, 1 << 20, dtype=torch.bfloat16, backend="torch",
                                 quantization=quantization)
    return cfg, runner, ledger.weight_bytes


def test_ledger_weight_bytes_halve_for_the_linears():
    cfg, _, bf16 = _ledger_weight_bytes(None)
    _, runner, fp8 = _ledger_weight_bytes("fp8")
    h, i = cfg.hidden_size, cfg.intermediate_size
    linear_params = cfg.num_layers * (h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 3 * h * i)
    scales = sum(layer.scale.numel() for layer in runner.model.linears() if isinstance(layer, Fp8Linear))
    assert bf16 - fp8 == linear_params - 4 * scales  # 2 bytes -> 1 byte per linear weight, plus fp32 scales
    assert all(isinstance(layer, Fp8Linear) for layer in runner.model.linears()[:-1])  # the head stays bf16


def test_tiny_engine_generates_with_fp8():
    """Greedy decoding through the engine with fp8 linears: runs, and on a model with sharp logits
    picks mostly the float model's tokens (fp8 error is small against a margin of a few logits)."""
    from runtime.llm import LLM
    from runtime.sampling_params import SamplingParams
    from tests.tiny_engine import tiny_engine

    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    prompts = [list(b"hello fp8"), list(b"the quick brown fox")]
    runs = [[o.outputs[0].token_ids for o in LLM.from_engine(tiny_engine(logit_scale=20.0, **kw)).generate(
        prompts, params, use_tqdm=False)] for kw in ({}, {"quantization": "fp8"})]
    float_ids, fp8_ids = (sum(r, []) for r in runs)
    assert len(fp8_ids) == 32
    assert sum(a == b for a, b in zip(float_ids, fp8_ids)) >= 24


def _write_fp8_checkpoint(path, block: bool) -> dict[str, torch.Tensor]:
    """A tiny HF folder whose linear weights are e4m3 with scales, as FP8 releases store them;
    returns the e4m3 weights as stored."""
    from safetensors.torch import load_file, save_file

    from tests.model_files import write_tiny_hf

    write_tiny_hf(str(path), hidden_size=256, intermediate_size=384, head_dim=64)  # two 128-blocks per row
    file = os.path.join(path, "model.safetensors")
    tensors, stored = load_file(file), {}
    for name in [n for n in tensors if n.endswith("proj.weight")]:
        q, scale = quantize_weight_blocks(tensors[name]) if block else quantize_rowwise(tensors[name])
        tensors[name], stored[name] = q, q
        tensors[name.replace("weight", "weight_scale_inv" if block else "weight_scale")] = scale
    save_file(tensors, file, metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  **({"weight_block_size": [128, 128]} if block else {})}
    (path / "config.json").write_text(json.dumps(cfg))
    return stored


@pytest.mark.parametrize("block", [True, False])
def test_fp8_checkpoint_loads_dequantized_and_requantizes_to_its_own_values(tmp_path, block):
    from runtime.accel.linears import QuantizedLinears
    from runtime.model.build import build_model
    from runtime.model.torch_backend import TorchBackend
    from weights.load_hf import load_hf

    stored = _write_fp8_checkpoint(tmp_path, block)
    ckpt = load_hf(str(tmp_path))
    assert ckpt.config.fp8_weight_block == (128 if block else None)
    name = "model.layers.0.mlp.down_proj.weight"
    assert ckpt.tensors[name].dtype == torch.float32
    linears = QuantizedLinears("fp8", torch.device("cpu"), torch.float32, ckpt.config.fp8_weight_block == 128)
    model = build_model(ckpt.config, ckpt.tensors, TorchBackend(), linears=linears)
    down = model.layers[0].down
    assert isinstance(down, Fp8Linear) and down.block_scaled == block
    assert torch.equal(down.weight.view(torch.uint8), stored[name].view(torch.uint8))


def test_fp8_checkpoint_errors_are_one_line(tmp_path):
    from weights.errors import ModelLoadError
    from weights.load_hf import load_hf

    _write_fp8_checkpoint(tmp_path, block=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [64, 64]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"\[64, 64\]"):
        load_hf(str(tmp_path))
    cfg["quantization_config"] = {"quant_method": "awq"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="awq"):
        load_hf(str(tmp_path))
