"""Build a `tokenizers.Tokenizer` from the vocabulary llama.cpp stores in GGUF metadata.

A GGUF carries no tokenizer.json: only tokens, merges (or scores), token types and a
pre-tokenizer *name*. We rebuild the pipeline the original HF tokenizer.json had, so ids match
the reference tokenizer, not just llama.cpp's approximation of it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from weights.errors import ModelLoadError

log = logging.getLogger(__name__)

# llama.cpp token types (llama_token_type).
_UNKNOWN, _CONTROL, _USER_DEFINED = 2, 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# "tokenizer.ggml.pre" -> how the original tokenizer.json split text (llama.cpp's groups).
_GPT2_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "trillion")
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")
_SPLIT_PRE = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"),
                    _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}
# Llama-3-style tokenizer.json files set BPE ignore_merges: a pre-token already in the vocab is kept whole.
_IGNORE_MERGES_PRE = {k for k, v in _SPLIT_PRE.items() if v is _LLAMA3_SPLIT}

# Tokens that end a turn; any of them present as a special token also stops generation (as llama.cpp does).
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
)


@dataclass
class GGUFVocab:
    """The tokenizer plus the bits of metadata the wrapper needs."""

    backend: HFTokenizer
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: list[int]
    pad_token_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level_pre_tokenizer(pre: str | None):
    """The pre-tokenizer of the original tokenizer.json for llama.cpp's pre-tokenizer name `pre`."""
    name = (pre or "default").lower()
    if name in _DIGITS_THEN_GPT2_PRE:
        # tokenizer.json: Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)].
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if name in _SPLIT_PRE:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRE[name]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if name not in _GPT2_PRE:
        log.warning("unknown GGUF pre-tokenizer %r: falling back to the GPT-2 split regex; "
                    "token ids may differ from the original tokenizer", pre)
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _parse_merges(merges: list[str]) -> list[tuple[str, str]]:
    out = []
    for m in merges:
        parts = m.split(" ")
        if len(parts) != 2:
            raise ModelLoadError(f"corrupt GGUF tokenizer: malformed merge {m!r}")
        out.append((parts[0], parts[1]))
    return out


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece GGUFs store scores, not merges: every split of a token into two vocab pieces
    is a merge ranked by the token's score (what transformers' generate_merges does)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in zip(tokens, scores):
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _build_byte_level(meta: dict[str, Any], tokens: list[str], types: list[int]) -> HFTokenizer:
    if "tokenizer.ggml.merges" not in meta:
        raise ModelLoadError("corrupt GGUF tokenizer: byte-level BPE ('gpt2') without tokenizer.ggml.merges")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        # Normal tokens must be spelled in the byte alphabet; added tokens (control/user-defined)
        # keep their raw text so the AddedToken matching typed text maps onto this same id.
        if types[i] not in (_CONTROL, _USER_DEFINED) and not set(tok) <= alphabet:
            tok = "".join(spelling[b] for b in tok.encode("utf-8"))
        vocab.setdefault(tok, i)
    pre = meta.get("tokenizer.ggml.pre")
    model = models.BPE(vocab, _parse_merges(meta["tokenizer.ggml.merges"]),
                       ignore_merges=(pre or "").lower() in _IGNORE_MERGES_PRE)
    tok = HFTokenizer(model)
    tok.pre_tokenizer = byte_level_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def _build_sentencepiece(meta: dict[str, Any], tokens: list[str]) -> HFTokenizer:
    """Llama/Mistral-style SentencePiece BPE with byte fallback, as transformers' LlamaTokenizer builds it."""
    if "tokenizer.ggml.merges" in meta:
        merges = _parse_merges(meta["tokenizer.ggml.merges"])
    elif "tokenizer.ggml.scores" in meta:
        merges = _merges_from_scores(tokens, meta["tokenizer.ggml.scores"])
    else:
        raise ModelLoadError("corrupt GGUF tokenizer: SentencePiece ('llama') without merges or scores")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id", 0)
    unk = tokens[unk_id] if 0 <= unk_id < len(tokens) else None
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if add_prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return tok


def build_from_gguf_metadata(meta: dict[str, Any]) -> GGUFVocab:
    """Rebuild the tokenizer a GGUF file describes; ModelLoadError for anything unsupported."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise ModelLoadError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    if types and len(types) != len(tokens):
        raise ModelLoadError(f"corrupt GGUF tokenizer: {len(types)} token types for {len(tokens)} tokens")

    def tid(key: str) -> int | None:
        v = meta.get(f"tokenizer.ggml.{key}")
        return int(v) if v is not None and 0 <= int(v) < len(tokens) else None

    bos, eos, pad = tid("bos_token_id"), tid("eos_token_id"), tid("padding_token_id")
    if kind == "gpt2":
        special_types = (_CONTROL,)
        backend = _build_byte_level(meta, tokens, types or [1] * len(tokens))
        add_bos_default = False
    elif kind == "llama":
        special_types = (_UNKNOWN, _CONTROL)
        backend = _build_sentencepiece(meta, tokens)
        add_bos_default = True  # llama.cpp and transformers add BOS when an SPM file does not say
    else:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer model {kind!r}: supported are 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)"
        )

    if types:
        special_ids = [i for i, t in enumerate(types) if t in special_types]
        user_ids = [i for i, t in enumerate(types) if t == _USER_DEFINED]
    else:  # old files without types: at least keep bos/eos whole
        special_ids, user_ids = sorted({i for i in (bos, eos) if i is not None}), []
    # normalized=False: match the raw text, as HF added tokens and llama.cpp's special parsing do.
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special_ids])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user_ids])

    eos_ids = [i for i in (eos, tid("eot_token_id"), tid("eom_token_id")) if i is not None]
    eos_ids += [i for i in special_ids if tokens[i] in END_OF_TURN_TOKENS]
    return GGUFVocab(
        backend=backend,
        vocab_size=len(tokens),
        bos_token_id=bos,
        eos_token_ids=list(dict.fromkeys(eos_ids)),
        pad_token_id=pad,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template") or None,
    )
