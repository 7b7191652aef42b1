"""Tiny random-weight transformers models: the oracle for our model code (no files needed)."""
from __future__ import annotations

import torch

from weights.config import ModelConfig

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0)


def tiny_hf_model(arch: str = "llama", seed: int = 0, **overrides):
    """A transformers model with random weights; arch in llama, qwen2, qwen3."""
    import transformers as tf

    torch.manual_seed(seed)
    kw = {**TINY, **overrides}
    if arch == "llama":
        conf = tf.LlamaConfig(**kw)
        model = tf.LlamaForCausalLM(conf)
    elif arch == "qwen2":
        kw.pop("head_dim")
        conf = tf.Qwen2Config(**kw)
        model = tf.Qwen2ForCausalLM(conf)
    elif arch == "qwen3":
        conf = tf.Qwen3Config(**kw)
        model = tf.Qwen3ForCausalLM(conf)
    else:
        raise ValueError(arch)
    # random init leaves norms at 1: perturb them so a missing norm would show
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model.float().eval()


def our_config(hf_model, arch: str = "llama") -> ModelConfig:
    c = hf_model.config
    return ModelConfig(
        arch=arch, vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_theta=getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"],
        rope_scaling=_rope_scaling(c), tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=arch == "qwen2", qk_norm=arch == "qwen3",
    )


def _rope_scaling(c) -> dict | None:
    params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None)
    if not params or params.get("rope_type", "default") == "default":
        return None
    return dict(params)


def state_dict(hf_model) -> dict[str, torch.Tensor]:
    sd = {k: v.clone() for k, v in hf_model.state_dict().items()}
    if hf_model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd
