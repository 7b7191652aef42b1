"""Turn a loaded checkpoint (HF-named float tensors) into a LlamaModel with fused weights, each linear
weight behind the Linear seam."""
from __future__ import annotations

from typing import Protocol

import torch

from runtime.errors import ModelLoadError
from runtime.model.attention_backend import AttentionBackend
from runtime.model.embedding import DenseEmbedding, Embedding
from runtime.model.linear import DenseLinear, Linear
from runtime.model.llama import DecoderLayer, LlamaModel
from runtime.model.rope import RotaryEmbedding
from weights.config import ModelConfig
from weights.quantized import Quantized, as_float, cat_rows

Weight = torch.Tensor | Quantized


def _take(tensors: dict[str, Weight], name: str, shape: tuple[int, ...]) -> Weight:
    if name not in tensors:
        raise ModelLoadError(f"checkpoint is missing tensor {name}")
    t = tensors.pop(name)  # pop: release checkpoint memory as the model fills
    if tuple(t.shape) != shape:
        raise ModelLoadError(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
    return t


def _checkpoint_params(cfg: ModelConfig, tensors: dict[str, Weight]) -> dict[str, Weight]:
    """Our names -> checkpoint tensors (q/k/v and gate/up concatenated); pops what it takes."""
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    params: dict[str, Weight] = {"embed": _take(tensors, "model.embed_tokens.weight", (cfg.vocab_size, h)),
                                       "norm": _take(tensors, "model.norm.weight", (h,))}
    if not cfg.tie_word_embeddings:
        params["lm_head"] = _take(tensors, "lm_head.weight", (cfg.vocab_size, h))
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        params[f"layers.{n}.input_norm"] = _take(tensors, p + "input_layernorm.weight", (h,))
        params[f"layers.{n}.post_norm"] = _take(tensors, p + "post_attention_layernorm.weight", (h,))
        params[f"layers.{n}.qkv"] = cat_rows([_take(tensors, a + "q_proj.weight", (q, h)),
                                              _take(tensors, a + "k_proj.weight", (kv, h)),
                                              _take(tensors, a + "v_proj.weight", (kv, h))])
        if cfg.attention_bias:
            params[f"layers.{n}.qkv_bias"] = torch.cat([_take(tensors, a + "q_proj.bias", (q,)),
                                                        _take(tensors, a + "k_proj.bias", (kv,)),
                                                        _take(tensors, a + "v_proj.bias", (kv,))])
        if cfg.qk_norm:
            params[f"layers.{n}.q_norm"] = _take(tensors, a + "q_norm.weight", (cfg.head_dim,))
            params[f"layers.{n}.k_norm"] = _take(tensors, a + "k_norm.weight", (cfg.head_dim,))
        params[f"layers.{n}.o_proj"] = _take(tensors, a + "o_proj.weight", (h, q))
        m = p + "mlp."
        params[f"layers.{n}.gate_up"] = cat_rows([_take(tensors, m + "gate_proj.weight", (i, h)),
                                                  _take(tensors, m + "up_proj.weight", (i, h))])
        params[f"layers.{n}.down"] = _take(tensors, m + "down_proj.weight", (h, i))
    return params


_LINEAR_NAMES = (*DecoderLayer.LINEARS, "qkv_bias", "lm_head")


class Linears(Protocol):
    """The linear-layer factory the build hands each weight to (runtime/accel/linears.py's picks the
    quantized and packed ones; DenseLinears holds every weight as a float tensor)."""

    def linear(self, weight: Weight, bias: torch.Tensor | None, head: bool = False) -> Linear: ...
    def embedding(self, table: Weight) -> Embedding: ...
    def tied_head(self, embedding: Embedding) -> Linear: ...
    def float(self, w: Weight | None) -> torch.Tensor | None: ...


class DenseLinears:
    """Every weight as a float tensor in the compute dtype."""

    def __init__(self, device: torch.device | str, dtype: torch.dtype) -> None:
        self.device, self.dtype = torch.device(device), dtype

    def float(self, w: Weight | None) -> torch.Tensor | None:
        return None if w is None else as_float(w).to(device=self.device, dtype=self.dtype).contiguous()

    def linear(self, weight: Weight, bias: torch.Tensor | None, head: bool = False) -> Linear:
        return DenseLinear(self.float(weight), self.float(bias))

    def embedding(self, table: Weight) -> Embedding:
        return DenseEmbedding(self.float(table))

    def tied_head(self, embedding: Embedding) -> Linear:
        return self.linear(embedding.table, None, head=True)


def build_model(cfg: ModelConfig, tensors: dict[str, Weight], backend: AttentionBackend,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                linears: Linears | None = None) -> LlamaModel:
    """Consumes `tensors` (entries are popped) and returns the model on `device` in `dtype`, each linear
    weight made by `linears` (default: DenseLinears); the backend then attaches its fused paths."""
    # fp32 tables: bf16 angles lose precision at long positions.
    rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling,
                           device=device, dtype=torch.float32)
    with torch.device("meta"):
        model = LlamaModel(cfg, backend, rope)
    make = linears or DenseLinears(device, dtype)
    params = _checkpoint_params(cfg, tensors)
    linear = {k: params.pop(k) for k in list(params) if k.rsplit(".", 1)[-1] in _LINEAR_NAMES}
    model.embedding = make.embedding(params.pop("embed"))
    model.load_state_dict({k: make.float(v) for k, v in params.items()}, strict=True, assign=True)  # the norms
    model.eval().requires_grad_(False)
    for n, layer in enumerate(model.layers):
        for name in layer.LINEARS:
            weight, bias = linear.pop(f"layers.{n}.{name}"), linear.pop(f"layers.{n}.{name}_bias", None)
            setattr(layer, name, make.linear(weight, bias))
    model.head = (make.linear(linear.pop("lm_head"), None, head=True) if "lm_head" in linear
                  else make.tied_head(model.embedding))
    backend.attach(model)
    return model
