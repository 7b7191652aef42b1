"""A loaded model: config plus weights (float32, or GGUF blocks kept quantized) under Hugging Face Llama
names, whatever the file format."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from weights.config import ModelConfig
from weights.errors import ModelLoadError


@dataclass
class Checkpoint:
    config: ModelConfig
    # float32 (or QuantizedTensor blocks where the loader kept them), HF naming; q/k projection rows
    # in HF (rotate-half RoPE) order.
    tensors: dict[str, Any]
    source: str  # "gguf" or "hf"
    metadata: dict[str, Any] = field(default_factory=dict)  # raw GGUF key/values; {} for HF folders
    path: str = ""


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs, by HF name, with its shape; both loaders validate against this."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv, d = config.q_size, config.kv_size, config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q,)
            shapes[p + "self_attn.k_proj.bias"] = (kv,)
            shapes[p + "self_attn.v_proj.bias"] = (kv,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def kv_scale_names(layer: int) -> tuple[str, str]:
    """vLLM's names of a layer's KV cache scales (K, V), which a checkpoint for an 8-bit cache may carry."""
    return f"model.layers.{layer}.self_attn.k_scale", f"model.layers.{layer}.self_attn.v_scale"


def check_shapes(tensors: dict[str, torch.Tensor], config: ModelConfig, path: str, describe=lambda n: n) -> None:
    """Raise a one-line ModelLoadError on the first missing or wrongly shaped tensor.

    `describe` maps an HF name to how the file calls it, so the message names what the user can find.
    """
    for name, shape in expected_shapes(config).items():
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"missing tensor {describe(name)} in {path}")
        if tuple(t.shape) != shape:
            raise ModelLoadError(
                f"tensor {describe(name)} has shape {list(t.shape)}, expected {list(shape)} "
                f"from the model config, in {path}"
            )
