"""The engine's tokenizer: a `tokenizers.Tokenizer` plus the special ids and chat template around it."""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Sequence

from tokenizers import Tokenizer as HFTokenizer

from runtime.tokenizer.chat_options import ChatOptions, open_final_message
from runtime.tokenizer.chat_template import render_chat_template
from weights.gguf_metadata import open_gguf, read_metadata
from weights.token_bytes import TokenBytes
from weights.tokenizer_files import tokenizer_from_gguf_metadata, tokenizer_from_hf_folder


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
        """From GGUF key/values (weights.gguf_metadata.read_metadata)."""
        return cls(**vars(tokenizer_from_gguf_metadata(meta)))

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        return cls.from_gguf_metadata(read_metadata(open_gguf(path)))

    @classmethod
    def from_hf_folder(cls, path: str | os.PathLike) -> "Tokenizer":
        """From a Hugging Face model folder: tokenizer.json, tokenizer_config.json, generation_config.json."""
        return cls(**vars(tokenizer_from_hf_folder(os.fspath(path))))

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
                            options: ChatOptions | None = None, **variables: Any) -> str:
        """The prompt text, as transformers' apply_chat_template(tokenize=False) renders it. options
        (when given) set add_generation_prompt, continue_final_message, extra variables and the template."""
        options = options or ChatOptions(add_generation_prompt=add_generation_prompt)
        specials = {"bos_token": self._token_str(self._bos), "eos_token": self._token_str(self.eos_token_id),
                    "pad_token": self._token_str(self._pad)}
        specials = {k: v for k, v in specials.items() if v is not None}
        text = render_chat_template(options.template or self._template, messages,
                                    add_generation_prompt=options.add_generation_prompt,
                                    **{**options.template_kwargs, **specials, **variables})
        return open_final_message(text, messages) if options.continue_final_message else text

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    options: ChatOptions | None = None, **variables: Any) -> list[int]:
        # The template writes BOS itself when the model wants one, so no special tokens are added.
        text = self.apply_chat_template(messages, add_generation_prompt, options, **variables)
        return self.encode(text, add_special_tokens=False)

    def with_chat_template(self, template: str) -> "Tokenizer":
        """The same tokenizer with another chat template (--chat-template)."""
        return Tokenizer(self._tok, bos_token_id=self._bos, eos_token_ids=self._eos, chat_template=template,
                         pad_token_id=self._pad, vocab_size=self._vocab_size)
