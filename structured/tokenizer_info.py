"""xgrammar's view of our tokenizer: each token's spelling, the vocabulary's encoding (byte-level BPE,
byte fallback, raw) and the logits width, built once per (tokenizer, vocabulary size)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported on first use: xgrammar brings transformers, seconds of start-up
    import xgrammar as xgr


def encoded_vocab(backend: Any, vocab_size: int) -> list[str]:
    """Token i's spelling in the vocabulary, "" for ids without one. Special tokens get "" too: the
    detokenizer drops them, so text inside the grammar must never come from one."""
    vocab = [""] * vocab_size
    for token, i in backend.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = token
    for i, added in backend.get_added_tokens_decoder().items():
        if i < vocab_size and added.special:
            vocab[i] = ""
    return vocab


@functools.lru_cache(maxsize=4)
def tokenizer_info(tokenizer: Any, vocab_size: int) -> xgr.TokenizerInfo:
    """vocab_size is the model's logits width: it may exceed the tokenizer's vocabulary (padded
    embedding rows), and the token bitmask must cover every logit."""
    import xgrammar as xgr

    backend = tokenizer.backend
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())  # what from_huggingface does
    return xgr.TokenizerInfo(encoded_vocab(backend, vocab_size), meta["vocab_type"], vocab_size=vocab_size,
                             stop_token_ids=list(tokenizer.eos_token_ids),
                             add_prefix_space=meta["add_prefix_space"])


@functools.lru_cache(maxsize=4)
def grammar_compiler(tokenizer: Any, vocab_size: int) -> xgr.GrammarCompiler:
    import xgrammar as xgr

    return xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size), max_threads=2)
