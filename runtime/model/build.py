"""Turn a loaded checkpoint (HF-named float tensors) into a LlamaModel with fused weights, each linear
weight behind the Linear seam."""
from __future__ import annotations

import torch

from runtime.errors import ModelLoadError
from runtime.model.attention_backend import AttentionBackend
from runtime.model.cpu_linear import PackedCpuLinear, pack_linear_weight
from runtime.model.linear import DenseLinear, Linear
from runtime.model.quantization import quantize_linear
from runtime.model.llama import DecoderLayer, LlamaModel
from runtime.model.rope import RotaryEmbedding
from weights.config import ModelConfig


def _take(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...]) -> torch.Tensor:
    if name not in tensors:
        raise ModelLoadError(f"checkpoint is missing tensor {name}")
    t = tensors.pop(name)  # pop: release checkpoint memory as the model fills
    if tuple(t.shape) != shape:
        raise ModelLoadError(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
    return t


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, quantization: str | None = None,
                fp8_block: bool = False) -> Linear:
    """The linear for this weight: quantized when asked (fp8_block: 128x128 block scales, as an FP8
    checkpoint stored them), else oneDNN-packed where that applies (fp32 on the CPU), else dense."""
    if quantization == "fp8" and fp8_block:
        from runtime.model.fp8_linear import Fp8Linear

        return Fp8Linear.quantize(weight, bias, block=True)
    if quantization is not None:
        return quantize_linear(quantization, weight, bias)
    packed = pack_linear_weight(weight)
    return DenseLinear(weight, bias) if packed is None else PackedCpuLinear(weight, bias, packed)


def _checkpoint_params(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> checkpoint tensors (q/k/v and gate/up concatenated); pops what it takes."""
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    params: dict[str, torch.Tensor] = {"embed": _take(tensors, "model.embed_tokens.weight", (cfg.vocab_size, h)),
                                       "norm": _take(tensors, "model.norm.weight", (h,))}
    if not cfg.tie_word_embeddings:
        params["lm_head"] = _take(tensors, "lm_head.weight", (cfg.vocab_size, h))
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        params[f"layers.{n}.input_norm"] = _take(tensors, p + "input_layernorm.weight", (h,))
        params[f"layers.{n}.post_norm"] = _take(tensors, p + "post_attention_layernorm.weight", (h,))
        params[f"layers.{n}.qkv"] = torch.cat([_take(tensors, a + "q_proj.weight", (q, h)),
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
        params[f"layers.{n}.gate_up"] = torch.cat([_take(tensors, m + "gate_proj.weight", (i, h)),
                                                   _take(tensors, m + "up_proj.weight", (i, h))])
        params[f"layers.{n}.down"] = _take(tensors, m + "down_proj.weight", (h, i))
    return params


_LINEAR_NAMES = (*DecoderLayer.LINEARS, "qkv_bias", "lm_head")


def build_model(cfg: ModelConfig, tensors: dict[str, torch.Tensor], backend: AttentionBackend,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                quantization: str | None = None) -> LlamaModel:
    """Consumes `tensors` (entries are popped) and returns the model on `device` in `dtype`; with
    `quantization` every decoder linear is quantized (the LM head and embedding stay in `dtype`)."""
    # fp32 tables: bf16 angles lose precision at long positions.
    rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling,
                           device=device, dtype=torch.float32)
    with torch.device("meta"):
        model = LlamaModel(cfg, backend, rope)
    state = {k: v.to(device=device, dtype=dtype).contiguous() for k, v in _checkpoint_params(cfg, tensors).items()}
    linear = {k: state.pop(k) for k in list(state) if k.rsplit(".", 1)[-1] in _LINEAR_NAMES}
    model.load_state_dict(state, strict=True, assign=True)  # the norms and the embedding table
    model.eval().requires_grad_(False)
    for n, layer in enumerate(model.layers):
        for name in layer.LINEARS:
            weight, bias = linear.pop(f"layers.{n}.{name}"), linear.pop(f"layers.{n}.{name}_bias", None)
            setattr(layer, name, make_linear(weight, bias, quantization, cfg.fp8_weight_block == 128))
    model.head = make_linear(linear.pop("lm_head", model.embed))
    return model
