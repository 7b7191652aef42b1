"""A tokenizer's parts as a checkpoint stores them: a GGUF's metadata, or a Hugging Face folder's
tokenizer.json, tokenizer_config.json, special_tokens_map.json and generation_config.json."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from weights.errors import ModelLoadError
from weights.gguf_vocab import END_OF_TURN_TOKENS, build_from_gguf_metadata
from weights.jsonfile import read_json_object


@dataclass
class TokenizerParts:
    """What runtime.tokenizer.Tokenizer is built from."""

    backend: HFTokenizer
    bos_token_id: int | None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    pad_token_id: int | None = None
    vocab_size: int | None = None


def _template_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> processors.TemplateProcessing:
    """BOS/EOS insertion on encode(add_special_tokens=True), built like transformers' update_post_processor."""
    single = ([f"{bos[0]}:0"] if bos else []) + ["$A:0"] + ([f"{eos[0]}:0"] if eos else [])
    pair = single + ([f"{bos[0]}:1"] if bos else []) + ["$B:1"] + ([f"{eos[0]}:1"] if eos else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=[t for t in (bos, eos) if t])


def _read_json(folder: str, name: str) -> dict[str, Any]:
    return read_json_object(os.path.join(folder, name), missing_ok=True)


def _token_text(value: Any) -> str | None:
    """tokenizer_config stores special tokens as "<s>" or as {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _hf_chat_template(folder: str, config: dict[str, Any]) -> str | None:
    """transformers' precedence: chat_template.jinja, then chat_template.json, then tokenizer_config."""
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        try:
            with open(jinja_path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read {jinja_path}: {exc}") from None
    template = _read_json(folder, "chat_template.json").get("chat_template") or config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None


def tokenizer_from_gguf_metadata(meta: dict[str, Any]) -> TokenizerParts:
    """From GGUF key/values (weights.gguf_metadata.read_metadata)."""
    v = build_from_gguf_metadata(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    bos = (tokens[v.bos_token_id], v.bos_token_id) if v.add_bos and v.bos_token_id is not None else None
    eos = (tokens[v.eos_token_ids[0]], v.eos_token_ids[0]) if v.add_eos and v.eos_token_ids else None
    if bos or eos:
        v.backend.post_processor = _template_processor(bos, eos)
    return TokenizerParts(v.backend, bos_token_id=v.bos_token_id, eos_token_ids=v.eos_token_ids,
                          chat_template=v.chat_template, pad_token_id=v.pad_token_id, vocab_size=v.vocab_size)


def tokenizer_from_hf_folder(folder: str) -> TokenizerParts:
    """From a Hugging Face model folder: tokenizer.json, tokenizer_config.json, generation_config.json."""
    if not os.path.isdir(folder):
        raise ModelLoadError(f"tokenizer folder not found: {folder}")
    tj = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(tj):
        hint = (" (a tokenizer.model alone is not supported: convert it to tokenizer.json)"
                if os.path.isfile(os.path.join(folder, "tokenizer.model")) else "")
        raise ModelLoadError(f"no tokenizer.json in {folder}{hint}")
    try:
        backend = HFTokenizer.from_file(tj)
    except Exception as exc:  # the Rust side raises plain Exception with a multi-line message
        raise ModelLoadError(f"cannot load {tj}: {' '.join(str(exc).split())}") from None
    config = _read_json(folder, "tokenizer_config.json")
    special_map = _read_json(folder, "special_tokens_map.json")
    gen = _read_json(folder, "generation_config.json")

    def special(name: str) -> tuple[str, int] | None:
        text = _token_text(config.get(name)) or _token_text(special_map.get(name))
        tid = backend.token_to_id(text) if text is not None else None
        return (text, tid) if tid is not None else None

    bos, eos, pad = special("bos_token"), special("eos_token"), special("pad_token")
    bos_id = bos[1] if bos else next(iter(_id_list(gen.get("bos_token_id"))), None)
    eos_ids = ([eos[1]] if eos else []) + _id_list(gen.get("eos_token_id"))
    eos_ids += [i for i, t in sorted(backend.get_added_tokens_decoder().items())
                if t.special and t.content in END_OF_TURN_TOKENS]
    # Like transformers: explicit add_bos/add_eos flags (or no post-processor) rebuild the template.
    if "add_bos_token" in config or "add_eos_token" in config or backend.post_processor is None:
        add_bos = bos if config.get("add_bos_token") else None
        add_eos = eos if config.get("add_eos_token") else None
        backend.post_processor = _template_processor(add_bos, add_eos)
    return TokenizerParts(backend, bos_token_id=bos_id, eos_token_ids=eos_ids,
                          chat_template=_hf_chat_template(folder, config), pad_token_id=pad[1] if pad else None)
