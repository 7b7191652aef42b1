"""Load a Hugging Face model folder (config.json + *.safetensors) into float tensors: bf16 ones as stored
(the CPU holds them so with --dtype bfloat16 / auto; the model build widens them otherwise), the rest as float32."""
from __future__ import annotations

import glob
import os
from typing import Any

import torch

from weights.checkpoint import Checkpoint, check_shapes, expected_shapes, kv_scale_names
from weights.config import ModelConfig
from weights.errors import ModelLoadError
from weights.fp8_checkpoint import dequantize_fp8_weights, fp8_weight_block, scale_names
from weights.jsonfile import read_json_object

# HF architecture -> our arch. Mistral is Llama compute (its sliding window is handled below).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def _read_json(path: str) -> dict[str, Any]:
    return read_json_object(path)


def _rope(cfg: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either transformers v4 (rope_theta/rope_scaling) or v5 (rope_parameters)."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling = cfg.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling:
        return theta, None
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)  # v4 configs used "type"
    scaling.pop("type", None)
    if kind in (None, "default"):
        return theta, None
    return theta, {"rope_type": kind, **scaling}


def config_from_hf(cfg: dict[str, Any], path: str, generation: dict[str, Any] | None = None) -> ModelConfig:
    archs = cfg.get("architectures") or [cfg.get("model_type")]
    hf_arch = archs[0]
    if hf_arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"unsupported architecture {hf_arch} in {path}/config.json (supported: {', '.join(ARCHITECTURES)})"
        )
    arch = ARCHITECTURES[hf_arch]
    if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelLoadError(f"unsupported activation {cfg['hidden_act']!r} in {path}/config.json")
    quant = cfg.get("quantization_config")
    fp8_block = fp8_weight_block(quant, path) if quant else None
    if cfg.get("mlp_bias"):
        raise ModelLoadError(f"mlp_bias=true is not supported ({path}/config.json)")
    # Qwen2 always has q/k/v bias (no config key). Elsewhere attention_bias also adds an o_proj bias we lack.
    if arch != "qwen2" and cfg.get("attention_bias"):
        raise ModelLoadError(f"attention_bias=true is only supported for Qwen2 ({path}/config.json)")
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        max_pos = int(cfg.get("max_position_embeddings") or 2048)
        # Sliding-window attention equals full attention while the sequence fits in the window,
        # so cap the context there instead of implementing it.
        window = cfg.get("sliding_window")
        if window and (hf_arch == "MistralForCausalLM" or cfg.get("use_sliding_window")):
            max_pos = min(max_pos, int(window))
        theta, scaling = _rope(cfg)
        eos: list[int] = []
        for source in (cfg, generation or {}):
            ids = source.get("eos_token_id")
            eos += [ids] if isinstance(ids, int) else [int(i) for i in ids or []]
        return ModelConfig(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=max_pos,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=list(dict.fromkeys(eos)),
            name=os.path.basename(os.path.normpath(path)),
            fp8_weight_block=fp8_block,
        )
    except KeyError as exc:
        raise ModelLoadError(f"{path}/config.json is missing {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"bad value in {path}/config.json: {exc}") from None


def _weight_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index} has no weight_map")
        files = [os.path.join(path, f) for f in dict.fromkeys(weight_map.values())]
        for f in files:
            if not os.path.isfile(f):
                raise ModelLoadError(f"{index} lists {os.path.basename(f)}, which is missing")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"no *.safetensors weights in {path} (.bin/.pth checkpoints are not supported)")
    return files


def load_hf(path: str) -> Checkpoint:
    from safetensors import safe_open

    cfg = _read_json(os.path.join(path, "config.json"))
    gen_path = os.path.join(path, "generation_config.json")
    generation = _read_json(gen_path) if os.path.isfile(gen_path) else None
    config = config_from_hf(cfg, path, generation)
    wanted = expected_shapes(config)
    fp8 = bool(cfg.get("quantization_config"))  # config_from_hf let only fp8 through
    wanted_scales = {s for name in wanted for s in scale_names(name)} if fp8 else set()
    kv_scales = {name for n in range(config.num_layers) for name in kv_scale_names(n)}

    tensors: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    if name in wanted:  # skip extras such as rotary inv_freq or a tied lm_head copy
                        t = f.get_tensor(name)
                        tensors[name] = t if fp8 or t.dtype == torch.bfloat16 else t.to(torch.float32)
                    elif name in wanted_scales:
                        scales[name] = f.get_tensor(name)
                    elif name in kv_scales:  # kept as they are: runtime/model/kv_scales.py reads them
                        tensors[name] = f.get_tensor(name).float()
        except Exception as exc:  # safetensors raises its own error types for truncated/corrupt files
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ModelLoadError(f"corrupt or truncated safetensors file {file}: {msg}") from None
    if fp8:
        dequantize_fp8_weights(tensors, scales, config.fp8_weight_block, path)
    check_shapes(tensors, config, path)
    return Checkpoint(config=config, tensors=tensors, source="hf", metadata={}, path=os.path.abspath(path))
