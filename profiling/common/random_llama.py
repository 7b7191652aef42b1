"""A random-weight Llama of a real model's shape, built on the GPU without a download: for benchmarks
whose speed depends on the shapes, never on the values (decode is bound by reading the weights)."""
from __future__ import annotations

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig


def llama3_8b_config(max_positions: int = 8192) -> ModelConfig:
    """Llama 3 8B's shape: 32 layers, hidden 4096, GQA 32:8, head_dim 128, vocab 128256."""
    return ModelConfig(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                       num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=max_positions,
                       rope_theta=500000.0, name="random-llama3-8b-shape")


def random_tensors(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
                   seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named random weights made directly on `device` in `dtype`, layer by layer (no host copy)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dtype).mul_(0.02)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, device=device, dtype=dtype)

    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    tensors = {"model.embed_tokens.weight": rnd(cfg.vocab_size, h), "model.norm.weight": ones(h),
               "lm_head.weight": rnd(cfg.vocab_size, h)}
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        tensors |= {p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
                    p + "self_attn.q_proj.weight": rnd(q, h), p + "self_attn.k_proj.weight": rnd(kv, h),
                    p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, q),
                    p + "mlp.gate_proj.weight": rnd(i, h), p + "mlp.up_proj.weight": rnd(i, h),
                    p + "mlp.down_proj.weight": rnd(h, i)}
    return tensors


def numbered_tokenizer(vocab_size: int) -> Tokenizer:
    """Token i is the word "t<i>": every id of a random model decodes to text; no EOS is ever produced."""
    backend = HFTokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=[], vocab_size=vocab_size)
