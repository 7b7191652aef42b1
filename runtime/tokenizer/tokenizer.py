"""The engine's tokenizer: a `tokenizers.Tokenizer` plus the special ids and chat template around it."""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Sequence

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from runtime.errors import ModelLoadError
from runtime.jsonfile import read_json_object
from runtime.tokenizer.chat_template import render_chat_template
from runtime.tokenizer.gguf_vocab import END_OF_TURN_TOKENS, build_from_gguf_metadata
from runtime.tokenizer.token_bytes import TokenBytes


def _never_shortens(spec: dict[str, Any]) -> bool:
    """True for a normalizer (its JSON form) that cannot make text shorter: SentencePiece-style
    vocabularies prepend '▁' and replace ' ' with '▁'. Anything else (NFC, strip, regex) may."""
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_never_shortens(n) for n in spec.get("normalizers", []))
    if kind == "Replace":
        pattern = spec.get("pattern", {}).get("String")
        return pattern is not None and len(pattern) <= len(spec.get("content", ""))
    return kind == "Prepend"


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


class Tokenizer:
    """Text <-> token ids, special-token ids and chat formatting for one model."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        chat_template: str | None = None,
        pad_token_id: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self._tok = backend
        self._bos = bos_token_id
        self._eos = list(dict.fromkeys(eos_token_ids))
        self._pad = pad_token_id
        self._template = chat_template
        self._vocab_size = vocab_size if vocab_size is not None else backend.get_vocab_size(with_added_tokens=True)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        """From GGUF key/values (runtime.model.gguf_metadata.read_metadata)."""
        v = build_from_gguf_metadata(meta)
        tokens = meta["tokenizer.ggml.tokens"]
        bos = (tokens[v.bos_token_id], v.bos_token_id) if v.add_bos and v.bos_token_id is not None else None
        eos = (tokens[v.eos_token_ids[0]], v.eos_token_ids[0]) if v.add_eos and v.eos_token_ids else None
        if bos or eos:
            v.backend.post_processor = _template_processor(bos, eos)
        return cls(v.backend, bos_token_id=v.bos_token_id, eos_token_ids=v.eos_token_ids,
                   chat_template=v.chat_template, pad_token_id=v.pad_token_id, vocab_size=v.vocab_size)

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        from runtime.model.gguf_metadata import open_gguf, read_metadata

        return cls.from_gguf_metadata(read_metadata(open_gguf(path)))

    @classmethod
    def from_hf_folder(cls, path: str | os.PathLike) -> "Tokenizer":
        """From a Hugging Face model folder: tokenizer.json, tokenizer_config.json, generation_config.json."""
        folder = os.fspath(path)
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
        return cls(backend, bos_token_id=bos_id, eos_token_ids=eos_ids, chat_template=_hf_chat_template(folder, config),
                   pad_token_id=pad[1] if pad else None)

    # ---- properties ----------------------------------------------------------------------------

    @property
    def backend(self) -> HFTokenizer:
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation: the eos, generation_config's, and end-of-turn specials."""
        return list(self._eos)

    @property
    def eos_token_id(self) -> int | None:
        return self._eos[0] if self._eos else None

    @property
    def pad_token_id(self) -> int | None:
        return self._pad

    @property
    def chat_template(self) -> str | None:
        """The model's own template; None means apply_chat_template falls back to ChatML."""
        return self._template

    @functools.cached_property
    def max_chars_per_token(self) -> int | None:
        """The most text characters one token can stand for (its longest vocabulary entry), or None
        when a normalizer may drop characters first and no such bound holds."""
        norm = self._tok.normalizer
        if norm is not None and not _never_shortens(json.loads(norm.__getstate__())):
            return None
        return max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)

    @functools.cached_property
    def _token_bytes(self) -> TokenBytes:
        return TokenBytes(self._tok)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token: part of a multi-byte character stays that part (decode gives U+FFFD)."""
        return self._token_bytes(token_id)

    def is_special(self, token_id: int) -> bool:
        """A special token (BOS, EOS, end of turn ...): decode(skip_special_tokens=True) leaves it out."""
        return token_id in self._special_ids

    @functools.cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    # ---- text <-> ids --------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special tokens typed in `text` (e.g. "<|im_start|>") become their single id."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat ----------------------------------------------------------------------------------

    def _token_str(self, token_id: int | None) -> str | None:
        return self._tok.id_to_token(token_id) if token_id is not None else None

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        """The prompt text, as transformers' apply_chat_template(tokenize=False) renders it."""
        specials = {"bos_token": self._token_str(self._bos), "eos_token": self._token_str(self.eos_token_id),
                    "pad_token": self._token_str(self._pad)}
        specials = {k: v for k, v in specials.items() if v is not None}
        return render_chat_template(self._template, messages, add_generation_prompt=add_generation_prompt,
                                    **{**specials, **variables})

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    **variables: Any) -> list[int]:
        # The template writes BOS itself when the model wants one, so no special tokens are added.
        text = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **variables)
        return self.encode(text, add_special_tokens=False)
