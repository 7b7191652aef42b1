"""Turn a loaded checkpoint (HF-named float tensors) into a LlamaModel with fused weights, each linear
weight behind the Linear seam."""
from __future__ import annotations

from itertools import accumulate

import torch

from runtime.accel.block_linear import BlockQuantEmbedding, BlockQuantLinear, BlockQuantParts, block_linear_supports
from runtime.accel.cpu_decode_step import CpuDecodeStep
from runtime.accel.cpu_linear import PackedCpuLinear, pack_linear_weight
from runtime.accel.quantization import QUANTIZATION_MODES, head_mode, quantize_linear
from runtime.errors import ModelLoadError
from runtime.model.attention_backend import AttentionBackend
from runtime.model.embedding import DenseEmbedding, Embedding
from runtime.model.linear import DenseLinear, Linear
from runtime.model.llama import DecoderLayer, LlamaModel
from runtime.model.rope import RotaryEmbedding
from weights.config import ModelConfig
from weights.quantized import Quantized, QuantizedParts, QuantizedTensor, as_float, cat_rows

Weight = torch.Tensor | Quantized


def _take(tensors: dict[str, Weight], name: str, shape: tuple[int, ...]) -> Weight:
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
        from runtime.accel.fp8_linear import Fp8Linear

        return Fp8Linear.quantize(weight, bias, block=True)
    if quantization is not None:
        return quantize_linear(quantization, weight, bias)
    packed = pack_linear_weight(weight)
    return DenseLinear(weight, bias) if packed is None else PackedCpuLinear(weight, bias, packed)


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


class _LinearFactory:
    """Picks each weight's Linear: a GGUF's blocks kept where the quantized kernel runs them (no
    --quantization), float weights quantized at load (a QUANTIZATION_MODES mode), else float."""

    def __init__(self, quantization: str | None, device: torch.device, dtype: torch.dtype,
                 fp8_block: bool = False) -> None:
        self.quantization, self.device, self.dtype = quantization, device, dtype
        self.fp8_block = fp8_block  # an FP8 checkpoint's 128x128 block scales

    def keeps(self, w: Weight) -> bool:
        if isinstance(w, QuantizedParts):
            return all(self.keeps(p) for p in w.parts)
        return (isinstance(w, QuantizedTensor) and self.quantization is None
                and block_linear_supports(w.type_name, *w.shape, self.device, self.dtype))

    def float(self, w: Weight | None) -> torch.Tensor | None:
        return None if w is None else as_float(w).to(device=self.device, dtype=self.dtype).contiguous()

    def linear(self, weight: Weight, bias: torch.Tensor | None, head: bool = False) -> Linear:
        bias = self.float(bias)
        if self.keeps(weight) and isinstance(weight, QuantizedParts):
            bounds = [0, *accumulate(p.shape[0] for p in weight.parts)]
            return BlockQuantParts([BlockQuantLinear(p.type_name, p.blocks, None if bias is None else bias[a:b])
                                    for p, a, b in zip(weight.parts, bounds, bounds[1:])])
        if self.keeps(weight):
            return BlockQuantLinear(weight.type_name, weight.blocks, bias)
        weight = self.float(weight)
        if self.quantization == "fp8":  # the LM head stays in the compute dtype
            return make_linear(weight, bias) if head else make_linear(weight, bias, "fp8", self.fp8_block)
        if self.quantization in QUANTIZATION_MODES and block_linear_supports("Q8_0", *weight.shape, self.device,
                                                                             self.dtype):
            return quantize_linear(head_mode(self.quantization) if head else self.quantization, weight, bias)
        return make_linear(weight, bias)

    def embedding(self, table: Weight) -> Embedding:
        if self.keeps(table):
            return BlockQuantEmbedding(table.type_name, table.blocks, table.cols)
        return DenseEmbedding(self.float(table))

    def tied_head(self, embedding: Embedding) -> Linear:
        if isinstance(embedding, BlockQuantEmbedding):
            return embedding.as_linear()
        return self.linear(embedding.table, None, head=True)


def build_model(cfg: ModelConfig, tensors: dict[str, Weight], backend: AttentionBackend,
                device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                quantization: str | None = None) -> LlamaModel:
    """Consumes `tensors` (entries are popped) and returns the model on `device` in `dtype`, its
    linears held as `quantization` says (see runtime/accel/quantization.py)."""
    # fp32 tables: bf16 angles lose precision at long positions.
    rope = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling,
                           device=device, dtype=torch.float32)
    with torch.device("meta"):
        model = LlamaModel(cfg, backend, rope)
    make = _LinearFactory(quantization, torch.device(device), dtype, cfg.fp8_weight_block == 128)
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
    if getattr(backend, "c_decode", False) and CpuDecodeStep.available(model):  # the CPU backend's C kernels
        model.decode_step = CpuDecodeStep(model)
    return model
