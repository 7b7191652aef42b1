"""The raw bytes each token of a vocabulary stands for (byte-level BPE or byte-fallback pieces).
Decoding one token alone loses them when it holds part of a multi-byte character (every such piece
decodes to U+FFFD); logprobs need the bytes themselves."""
from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from weights.gguf_vocab import bytes_to_unicode

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback: "<0xF0>" is the byte 0xF0


def _decoder_kinds(spec: dict[str, Any] | None) -> set[str]:
    if not spec:
        return set()
    if spec.get("type") == "Sequence":
        return set().union(*(_decoder_kinds(d) for d in spec.get("decoders", [])))
    return {spec.get("type", "")}


class TokenBytes:
    """token id -> bytes: byte-level BPE maps each character back through GPT-2's byte table;
    SentencePiece reads "<0xNN>" pieces as bytes and "▁" as a space; added tokens are their text."""

    def __init__(self, backend: HFTokenizer) -> None:
        self._tok = backend
        decoder = backend.decoder
        kinds = _decoder_kinds(json.loads(decoder.__getstate__()) if decoder is not None else None)
        self._byte_level = {c: b for b, c in bytes_to_unicode().items()} if "ByteLevel" in kinds else None
        self._byte_fallback = "ByteFallback" in kinds
        self._added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        raw = self._cache.get(token_id)
        if raw is None:
            raw = self._cache[token_id] = self._bytes(token_id)
        return raw

    def _bytes(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._tok.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level is not None and all(c in self._byte_level for c in piece):
            return bytes(self._byte_level[c] for c in piece)
        if self._byte_fallback:
            byte = _BYTE_PIECE.fullmatch(piece)
            return bytes([int(byte.group(1), 16)]) if byte else piece.replace("\u2581", " ").encode("utf-8")
        return self._tok.decode([token_id], skip_special_tokens=False).encode("utf-8")
