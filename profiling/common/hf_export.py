"""Write a Checkpoint as a Hugging Face model folder, so HF-only tools (transformers, vLLM) can run the same weights.

Bench-only (bench_offline runs vLLM on the export), so it lives with the benchmarks, not in the engine."""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

import torch

from weights.checkpoint import Checkpoint, expected_shapes
from weights.config import ModelConfig

_HF_ARCH = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
            "qwen3": ("Qwen3ForCausalLM", "qwen3")}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja")


def _eos(config: ModelConfig) -> int | list[int] | None:
    ids = config.eos_token_ids
    return None if not ids else ids[0] if len(ids) == 1 else list(ids)


def hf_config_dict(config: ModelConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """config.json contents in the transformers v4 spelling (rope_theta/rope_scaling), which v5 and vLLM also read."""
    hf_arch, model_type = _HF_ARCH[config.arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": _eos(config),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if model_type == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
    else:  # qwen2 has no such key: its q/k/v bias is implied by the architecture
        cfg["attention_bias"] = False
    if model_type == "llama":
        cfg["mlp_bias"] = False
    return cfg


def export_hf_folder(checkpoint: Checkpoint, tokenizer_dir: str | None, out_dir: str,
                     dtype: torch.dtype = torch.float32) -> str:
    """Write config.json, generation_config.json and model.safetensors (plus tokenizer files found in
    tokenizer_dir, if given) to out_dir; returns out_dir. float32 by default: dequantized GGUF values
    are then kept exactly."""
    from safetensors.torch import save_file

    config = checkpoint.config
    os.makedirs(out_dir, exist_ok=True)
    # Only the tensors the architecture defines (a tied model writes no lm_head: safetensors cannot share storage).
    tensors = {name: checkpoint.tensors[name].to(dtype).contiguous() for name in expected_shapes(config)}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config_dict(config, dtype), f, indent=2)
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": _eos(config)}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
    if tokenizer_dir:
        for name in TOKENIZER_FILES:
            src = os.path.join(tokenizer_dir, name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(out_dir, name))
    return out_dir
