"""Write tiny random-weight checkpoints (GGUF and HF folders) for tests.

Written independently of the loaders where it matters: GGUF names come from the gguf package's own
tables, and llama q/k rows are permuted with llama.cpp's converter formula, so a loader that
mis-maps or mis-unpermutes fails the round trip.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable

import gguf
import numpy as np
import torch
from gguf import MODEL_TENSOR, TENSOR_NAMES

from tests.kquant_quantize import quantize_kquant
from weights.checkpoint import expected_shapes
from weights.config import ModelConfig

TINY: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
    bos_token_id=1, eos_token_ids=[2],
)
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# HF name suffix -> gguf tensor kind (per-layer names use {bid}).
_GGUF_KIND = {
    "input_layernorm.weight": MODEL_TENSOR.ATTN_NORM, "self_attn.q_proj.weight": MODEL_TENSOR.ATTN_Q,
    "self_attn.k_proj.weight": MODEL_TENSOR.ATTN_K, "self_attn.v_proj.weight": MODEL_TENSOR.ATTN_V,
    "self_attn.o_proj.weight": MODEL_TENSOR.ATTN_OUT, "self_attn.q_norm.weight": MODEL_TENSOR.ATTN_Q_NORM,
    "self_attn.k_norm.weight": MODEL_TENSOR.ATTN_K_NORM,
    "post_attention_layernorm.weight": MODEL_TENSOR.FFN_NORM, "mlp.gate_proj.weight": MODEL_TENSOR.FFN_GATE,
    "mlp.up_proj.weight": MODEL_TENSOR.FFN_UP, "mlp.down_proj.weight": MODEL_TENSOR.FFN_DOWN,
}


def tiny_config(arch: str = "llama", **overrides: Any) -> ModelConfig:
    fields = dict(TINY, arch=arch, attention_bias=arch == "qwen2", qk_norm=arch == "qwen3", name=f"tiny-{arch}")
    fields.update(overrides)
    return ModelConfig(**fields)


def random_tensors(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-layout float32 weights; norms near 1 like real models, the rest small."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(config).items():
        t = torch.randn(shape, generator=g)
        out[name] = 1.0 + 0.1 * t if name.endswith("norm.weight") else 0.05 * t
    return out


def to_gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
    if hf == "model.norm.weight":
        return TENSOR_NAMES[MODEL_TENSOR.OUTPUT_NORM] + ".weight"
    if hf == "lm_head.weight":
        return TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight"
    _, _, layer, rest = hf.split(".", 3)
    if rest.endswith(".bias"):  # q/k/v bias: same kind as the weight
        kind = _GGUF_KIND[rest[: -len(".bias")] + ".weight"]
        return TENSOR_NAMES[kind].format(bid=layer) + ".bias"
    return TENSOR_NAMES[_GGUF_KIND[rest]].format(bid=layer) + ".weight"


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Verbatim from llama.cpp convert_hf_to_gguf.py (LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_cpp_rope_freqs(scaling: dict, theta: float, head_dim: int) -> np.ndarray:
    """Verbatim logic of llama.cpp's converter for llama3 RoPE scaling -> the rope_freqs tensor."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _encode(w: torch.Tensor, qtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """GGUF data for a float tensor and the raw type to declare (None: the writer infers F32/F16)."""
    arr = w.numpy()
    if qtype == "F32":
        return arr, None
    if qtype == "F16":
        return arr.astype(np.float16), None
    qt = gguf.GGMLQuantizationType[qtype]
    if qtype in ("Q4_K", "Q5_K", "Q6_K"):  # gguf reads these but cannot write them
        return quantize_kquant(arr, qtype), qt
    return gguf.quants.quantize(arr, qt), qt


def stored_values(w: torch.Tensor, qtype: str) -> torch.Tensor:
    """The float32 values a reader gets back for w written as qtype (gguf's reference dequantizer)."""
    data, qt = _encode(w, qtype)
    if qt is None:
        return torch.from_numpy(data.astype(np.float32))
    return torch.from_numpy(gguf.quants.dequantize(data, qt).reshape(w.shape).copy())


def write_tiny_gguf(path: str, qtype: str = "F32", arch: str = "llama", *, seed: int = 0,
                    tensor_types: dict[str, str] | None = None, skip_keys: Iterable[str] = (),
                    skip_tensors: Iterable[str] = (), meta_overrides: dict[str, Any] | None = None,
                    **overrides: Any) -> dict[str, torch.Tensor]:
    """Tiny model as GGUF. 2-D weights get `qtype` (or tensor_types[gguf_name]); norms and biases F32,
    like llama.cpp. Returns the HF-layout float32 tensors actually stored (after the quantize round trip).
    Row permutation commutes with per-row block quantization, so those are computed in HF layout."""
    config = tiny_config(arch, **overrides)
    hf = random_tensors(config, seed)
    meta: dict[str, Any] = {
        f"{arch}.context_length": config.max_position_embeddings,
        f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.block_count": config.num_layers,
        f"{arch}.attention.head_count": config.num_heads,
        f"{arch}.attention.head_count_kv": config.num_kv_heads,
        f"{arch}.attention.key_length": config.head_dim,
        f"{arch}.attention.value_length": config.head_dim,
        f"{arch}.rope.dimension_count": config.head_dim,
        f"{arch}.rope.freq_base": float(config.rope_theta),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        f"{arch}.vocab_size": config.vocab_size,
        "general.name": config.name,
        "tokenizer.ggml.bos_token_id": config.bos_token_id,
        "tokenizer.ggml.eos_token_id": config.eos_token_ids[0],
    }
    extra: dict[str, np.ndarray] = {}
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") == "llama3":  # llama.cpp stores these as a tensor, not metadata
        extra["rope_freqs.weight"] = llama_cpp_rope_freqs(scaling, config.rope_theta, config.head_dim)
        meta[f"{arch}.rope.scaling.original_context_length"] = scaling["original_max_position_embeddings"]
    elif scaling:
        meta[f"{arch}.rope.scaling.type"] = scaling["rope_type"]
        meta[f"{arch}.rope.scaling.factor"] = float(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            meta[f"{arch}.rope.scaling.original_context_length"] = scaling["original_max_position_embeddings"]
    meta.update(meta_overrides or {})

    writer = gguf.GGUFWriter(path, arch)
    for key, value in meta.items():
        if key in skip_keys:
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
    stored: dict[str, torch.Tensor] = {}
    skip = set(skip_tensors)
    n_heads = {"self_attn.q_proj.weight": config.num_heads, "self_attn.k_proj.weight": config.num_kv_heads}
    for name, w in hf.items():
        gname = to_gguf_name(name)
        if gname in skip:
            continue
        t = (tensor_types or {}).get(gname, qtype if w.dim() == 2 else "F32")
        suffix = name.split(".", 3)[-1]
        on_disk = w
        if arch == "llama" and suffix in n_heads:  # llama.cpp permutes only llama's q/k rows
            on_disk = llama_cpp_permute(w, n_heads[suffix])
        data, raw = _encode(on_disk, t)
        writer.add_tensor(gname, data, raw_dtype=raw)
        stored[name] = stored_values(w, t)
    for name, arr in extra.items():
        writer.add_tensor(name, arr)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def _hf_config(config: ModelConfig, hf_arch: str) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings, "hidden_act": "silu",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else config.eos_token_ids,
        "torch_dtype": "float32",
    }
    if hf_arch != "Qwen2ForCausalLM":  # real Qwen2 configs have no attention_bias key
        cfg["attention_bias"] = False
    return cfg


def write_tiny_hf(path: str, dtype: torch.dtype = torch.float32, arch: str = "llama", *, shards: int = 1,
                  seed: int = 0, config_overrides: dict[str, Any] | None = None,
                  **overrides: Any) -> dict[str, torch.Tensor]:
    """Tiny model as an HF folder (config.json + safetensors, sharded with an index when shards > 1).
    arch may also be "mistral". Returns the float32 values actually stored (after the dtype round trip)."""
    from safetensors.torch import save_file

    config = tiny_config("llama" if arch == "mistral" else arch, **overrides)
    os.makedirs(path, exist_ok=True)
    cfg = _hf_config(config, HF_ARCHITECTURES[arch])
    cfg.update(config_overrides or {})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    tensors = {k: v.to(dtype) for k, v in random_tensors(config, seed).items()}
    names = list(tensors)
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i::shards]}
            save_file(part, os.path.join(path, fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return {k: v.to(torch.float32) for k, v in tensors.items()}
