"""Load a llama.cpp GGUF file (llama / qwen2 / qwen3) into tensors under HF Llama names: float32, or
Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K weights kept in their blocks (keep_quantized)."""
from __future__ import annotations

import math
import os
import re
import warnings
from typing import Any

import numpy as np
import torch

from weights.checkpoint import Checkpoint, check_shapes, expected_shapes
from weights.config import ModelConfig
from weights.errors import ModelLoadError
from weights.gguf_metadata import open_gguf, read_metadata
from weights.gguf_quants import dequantize_gguf
from weights.quantized import KEPT_TYPES, QuantizedTensor, block_shape

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")  # Mistral/Mixtral-free Llama variants convert as "llama"
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_HF_LAYER_TO_GGUF = {v: k for k, v in _LAYER_NAMES.items()}
_HF_GLOBAL_TO_GGUF = {v: k for k, v in _GLOBAL_NAMES.items()}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str | None:
    """HF name for a GGUF tensor name, or None when the tensor is not one we know."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def gguf_name(hf: str) -> str:
    """GGUF name for an HF name (inverse of hf_name); used in messages and by the test writer."""
    if hf in _HF_GLOBAL_TO_GGUF:
        return _HF_GLOBAL_TO_GGUF[hf]
    m = _HF_LAYER.fullmatch(hf)
    if m and m.group(2) in _HF_LAYER_TO_GGUF:
        return f"blk.{m.group(1)}.{_HF_LAYER_TO_GGUF[m.group(2)]}"
    return hf


def permute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF -> GGUF row order, exactly as llama.cpp's converter does for llama q/k (interleaved RoPE pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """GGUF -> HF row order (inverse of permute_qk), so the model can use rotate-half RoPE."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- config ----------------------------------------------------------------------------------------

def _f32(v: float) -> float:
    # GGUF floats are float32: 1e-5 comes back as 9.999999747e-06. Keep the shortest decimal that
    # round-trips, so the config (and an exported config.json) reads like the original.
    return float(str(np.float32(v)))


def _get(meta: dict[str, Any], key: str, kind: type, path: str, default: Any = None) -> Any:
    v = meta.get(key, default)
    if v is None:
        raise ModelLoadError(f"GGUF metadata key {key} is missing in {path}")
    if kind is int and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
        return _f32(v)
    if kind is str and isinstance(v, str):
        return v
    raise ModelLoadError(f"GGUF metadata key {key} has value {str(v)[:60]!r}, expected {kind.__name__}, in {path}")


def _llama3_scaling(factors: torch.Tensor, theta: float, head_dim: int, orig_ctx: int, path: str) -> dict | None:
    """Recover the HF llama3 rope_scaling dict from llama.cpp's precomputed rope_freqs tensor.

    llama.cpp stores per-frequency divisors r_i instead of the parameters. The llama3 formula only
    depends on original_max_position_embeddings / {low,high}_freq_factor, so we fix the original
    context length and fit the two factors; the result is checked by recomputing the divisors.
    """
    r = factors.double()
    x = 1.0 / (2 * math.pi * theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))  # 1/wavelen
    f = float(r.max())
    if f <= 1.0 + 1e-6:
        return None
    s = (1.0 / r - 1.0 / f) / (1.0 - 1.0 / f)  # 1 for untouched high frequencies, 0 for fully scaled
    mid = (s > 1e-4) & (s < 1 - 1e-4)
    # Bracket of 1/wavelen where the transition must lie: above all fully scaled, below all untouched.
    x_lo_bound = float(x[s <= 1e-4].max()) if bool((s <= 1e-4).any()) else 0.0
    x_hi_bound = float(x[s >= 1 - 1e-4].min()) if bool((s >= 1 - 1e-4).any()) else float(x.max()) * 2
    if int(mid.sum()) >= 2:  # s is linear in 1/wavelen over the transition band: s = (x - x_lo) / (x_hi - x_lo)
        a, b = np.polyfit(x[mid].numpy(), s[mid].numpy(), 1)
        x_lo, x_hi = -b / a, (1 - b) / a
    elif int(mid.sum()) == 1:  # one point: any line through it that stays inside the bracket
        xm, sm = float(x[mid]), float(s[mid])
        delta = 0.5 * min((xm - x_lo_bound) / max(sm, 1e-9), (x_hi_bound - xm) / max(1 - sm, 1e-9))
        x_lo, x_hi = xm - sm * delta, xm + (1 - sm) * delta
    else:  # a step: put a narrow transition band between the two groups
        x_lo = math.sqrt(x_lo_bound * x_hi_bound) if x_lo_bound > 0 else x_hi_bound / 2
        x_hi = x_lo * (1 + 1e-6)
    scaling = {
        "rope_type": "llama3",
        "factor": f,
        "low_freq_factor": orig_ctx * x_lo,
        "high_freq_factor": orig_ctx * x_hi,
        "original_max_position_embeddings": orig_ctx,
    }
    if not torch.allclose(llama3_divisors(scaling, theta, head_dim), r, rtol=1e-3, atol=1e-4):
        raise ModelLoadError(f"rope_freqs.weight does not follow the llama3 RoPE scaling formula in {path}")
    return scaling


def llama3_divisors(scaling: dict, theta: float, head_dim: int) -> torch.Tensor:
    """Per-frequency divisors r_i (inv_freq_scaled = inv_freq / r_i) of HF's llama3 RoPE scaling."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    wavelen = 2 * math.pi / inv
    f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    smooth = (old / wavelen - lo) / (hi - lo)
    r = 1.0 / ((1 - smooth) / f + smooth)
    r = torch.where(wavelen < old / hi, torch.ones_like(r), r)
    return torch.where(wavelen > old / lo, torch.full_like(r, f), r)


def _rope_scaling(meta: dict[str, Any], arch: str, path: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = _get(meta, f"{arch}.rope.scaling.factor", float, path)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": factor}
        for key, hf in (("original_context_length", "original_max_position_embeddings"),
                        ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if f"{arch}.rope.scaling.{key}" in meta:
                scaling[hf] = meta[f"{arch}.rope.scaling.{key}"]
        return scaling
    raise ModelLoadError(f"unsupported RoPE scaling type {kind!r} in {path}")


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str], path: str) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ModelLoadError(
            f"unsupported GGUF architecture {arch!r} in {path} (supported: {', '.join(SUPPORTED_ARCHS)})"
        )
    hidden = _get(meta, f"{arch}.embedding_length", int, path)
    heads = _get(meta, f"{arch}.attention.head_count", int, path)
    if heads <= 0 or hidden <= 0:
        raise ModelLoadError(f"GGUF metadata has non-positive embedding_length/head_count in {path}")
    head_dim = _get(meta, f"{arch}.attention.key_length", int, path, default=hidden // heads)
    rope_dim = _get(meta, f"{arch}.rope.dimension_count", int, path, default=head_dim)
    if rope_dim != head_dim:
        raise ModelLoadError(f"partial RoPE ({rope_dim} of {head_dim} head dims) is not supported: {path}")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else _get(meta, f"{arch}.vocab_size", int, path)
    theta = _get(meta, f"{arch}.rope.freq_base", float, path, default=10000.0)
    ctx = _get(meta, f"{arch}.context_length", int, path)
    scaling = _rope_scaling(meta, arch, path)
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                             "tokenizer.ggml.eom_token_id") if isinstance(meta.get(k), int)]
    try:
        return ModelConfig(
            arch=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=_get(meta, f"{arch}.feed_forward_length", int, path),
            num_layers=_get(meta, f"{arch}.block_count", int, path),
            num_heads=heads,
            num_kv_heads=_get(meta, f"{arch}.attention.head_count_kv", int, path, default=heads),
            head_dim=head_dim,
            max_position_embeddings=ctx,
            rms_norm_eps=_get(meta, f"{arch}.attention.layer_norm_rms_epsilon", float, path),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            # llama.cpp stops on every end-of-generation token, not just eos (e.g. Llama 3's <|eot_id|>).
            eos_token_ids=list(dict.fromkeys(eos)),
            name=str(meta.get("general.name") or os.path.basename(path)),
        )
    except ValueError as exc:
        raise ModelLoadError(f"inconsistent GGUF metadata in {path}: {exc}") from None


# --- loader ----------------------------------------------------------------------------------------

def _blocks(data: np.ndarray, rows: int) -> torch.Tensor:
    """The tensor's bytes as uint8 [rows, row_bytes], a view of the memory map (read-only: the
    weights are never written, so torch's warning about that does not apply)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(data.reshape(-1).view(np.uint8)).view(rows, -1)


def _read_tensor(t, shape: list[int], keep_quantized: bool, path: str) -> torch.Tensor | QuantizedTensor:
    kind = t.tensor_type.name
    if keep_quantized and kind in KEPT_TYPES and len(shape) == 2 and shape[1] % block_shape(kind)[0] == 0:
        values, block_bytes = block_shape(kind)
        if t.n_bytes != shape[0] * shape[1] // values * block_bytes:
            raise ModelLoadError(f"tensor {t.name} holds {t.n_bytes} bytes, expected {shape} of {kind}: {path}")
        return QuantizedTensor(kind, _blocks(t.data, shape[0]), shape[1])
    flat = dequantize_gguf(t.data, kind)
    if flat.numel() != math.prod(shape):
        raise ModelLoadError(f"tensor {t.name} holds {flat.numel()} values, expected {shape}: {path}")
    return flat.reshape(shape)


def load_gguf(path: str, keep_quantized: bool = False) -> Checkpoint:
    """keep_quantized: 2-D weights of KEPT_TYPES stay in their blocks (QuantizedTensor over the
    memory map) instead of being dequantized to float32."""
    reader = open_gguf(path)
    meta = read_metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    config = config_from_metadata(meta, set(by_name), path)
    wanted = expected_shapes(config)

    rope_freqs = by_name.pop("rope_freqs.weight", None)
    file_size = os.path.getsize(path)
    for name, t in by_name.items():  # validate everything before the slow part
        hf = hf_name(name)
        if hf is None or hf not in wanted:
            raise ModelLoadError(f"unexpected tensor {name} for a {config.arch} model in {path}")
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"tensor {name} has type {t.tensor_type.name}, which is not supported "
                f"(supported: {', '.join(SUPPORTED_TYPES)}): {path}"
            )
        if t.data_offset + t.n_bytes > file_size:  # gguf's reader catches this today; don't rely on it
            raise ModelLoadError(f"tensor {name} runs past the end of the file (truncated download?): {path}")

    if rope_freqs is not None:
        if rope_freqs.tensor_type.name != "F32" or rope_freqs.n_elements != config.head_dim // 2:
            raise ModelLoadError(f"rope_freqs.weight must be F32 with head_dim/2 values in {path}")
        orig = _get(meta, f"{config.arch}.rope.scaling.original_context_length", int, path, default=8192)
        config.rope_scaling = _llama3_scaling(
            dequantize_gguf(rope_freqs.data, "F32"), config.rope_theta, config.head_dim, orig, path
        )

    tensors: dict[str, torch.Tensor | QuantizedTensor] = {}
    for name, t in by_name.items():
        shape = [int(d) for d in reversed(t.shape.tolist())]  # GGUF lists dims innermost first
        tensors[hf_name(name)] = _read_tensor(t, shape, keep_quantized, path)
    check_shapes(tensors, config, path, describe=gguf_name)

    if config.arch == "llama":  # llama.cpp permuted these rows for its interleaved RoPE; qwen is stored as-is
        for n in range(config.num_layers):
            for proj, n_head in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads)):
                key = f"model.layers.{n}.self_attn.{proj}.weight"
                w = tensors[key]  # whole rows move, so quantized blocks permute like float rows
                tensors[key] = (w.with_blocks(unpermute_qk(w.blocks, n_head)) if isinstance(w, QuantizedTensor)
                                else unpermute_qk(w, n_head))
    return Checkpoint(config=config, tensors=tensors, source="gguf", metadata=meta, path=os.path.abspath(path))
