"""Tiny random-weight engines for fast unit tests: a byte-level tokenizer and a 2-layer model."""
from __future__ import annotations

import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from runtime.build import build_engine
from runtime.device import default_kv_dtype
from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.tokenizer.tokenizer import Tokenizer
from tests.hf_tiny import our_config, state_dict, tiny_hf_model
from weights.gguf_vocab import bytes_to_unicode

BOS, EOS = 256, 257
TINY_VOCAB = 260
CHATML = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
          "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def byte_tokenizer() -> Tokenizer:
    """Every byte is one token (ids 0-255), plus <s>=256 and </s>=257 as special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: _byte_of(c)))}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    return Tokenizer(backend, bos_token_id=BOS, eos_token_ids=[EOS], chat_template=CHATML, vocab_size=TINY_VOCAB)


def _byte_of(ch: str) -> int:
    return {v: k for k, v in bytes_to_unicode().items()}[ch]


def tiny_weights(arch: str = "llama", seed: int = 0, logit_scale: float = 1.0, vocab_size: int = TINY_VOCAB,
                 **shape):
    """(ModelConfig, HF-named tensors) of a random 2-layer model; logit_scale sharpens its outputs;
    shape: transformers config overrides (num_key_value_heads=4 ...)."""
    hf = tiny_hf_model(arch, seed=seed, vocab_size=vocab_size, max_position_embeddings=1024, **shape)
    tensors = state_dict(hf)
    tensors["lm_head.weight"] = tensors["lm_head.weight"] * logit_scale
    return our_config(hf, arch), tensors


def tiny_engine(arch: str = "llama", seed: int = 0, num_blocks: int = 256, logit_scale: float = 1.0,
                engine_seed: int = 0, kv_heads: int | None = None, chat_template: str | None = None,
                tokenizer: Tokenizer | None = None, **config) -> LLMEngine:
    """A random 2-layer model over the byte tokenizer (or tokenizer); num_blocks sizes the KV pool exactly
    (per rank under tensor or pipeline parallelism). seed picks the weights, engine_seed the sampling of requests
    without a seed of their own; kv_heads overrides the model's 2 KV heads; chat_template replaces the
    tokenizer's. The model's vocabulary is the tokenizer's (a real one: 49k rows, still tiny)."""
    tokenizer = tokenizer or byte_tokenizer()
    cfg, tensors = tiny_weights(arch, seed, logit_scale, tokenizer.vocab_size,
                                **({"num_key_value_heads": kv_heads} if kv_heads else {}))
    config["seed"] = engine_seed
    config.setdefault("block_size", 16)
    rank_kv_heads = max(1, cfg.num_kv_heads // config.get("tensor_parallel_size", 1))
    stage0_layers = -(-cfg.num_layers // max(1, config.get("pipeline_parallel_size", 1)))  # rank 0's stage holds these
    # num_blocks counts blocks of the default cache (bf16 on the CPU); a named dtype's budget is float32's
    auto = config.get("kv_cache_dtype", "auto") == "auto"
    element = default_kv_dtype(torch.float32, torch.device("cpu")).itemsize if auto else 4
    per_block = config["block_size"] * 2 * rank_kv_heads * cfg.head_dim * element * stage0_layers
    econf = EngineConfig(device="cpu", backend="torch", kv_cache_memory=num_blocks * per_block,
                         log_ledger=False, **config)
    return build_engine(econf, cfg, tensors, tokenizer.with_chat_template(chat_template) if chat_template else tokenizer)
