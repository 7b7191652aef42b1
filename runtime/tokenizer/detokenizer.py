"""Streaming detokenization: turn generated ids into text one token at a time.

Uses vLLM's prefix_offset/read_offset scheme: decode only a short window (a few already-emitted
tokens for context + the new ones), so each step costs O(window), not O(output). Context matters
for SentencePiece decoders, which drop a leading space at the start of a decode. While the window
ends in U+FFFD a multi-byte character is still incomplete, so nothing is emitted yet.
"""
from __future__ import annotations

import codecs
from typing import Sequence

from runtime.tokenizer.tokenizer import Tokenizer

# How many prompt tokens to keep as decoding context (vLLM's INITIAL_INCOMING_OFFSET).
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    """Feed ids with add(); the concatenated outputs (plus flush()) equal decode(all added ids).

    With prompt_ids, the last few prompt tokens are decoding context only (never emitted), so a
    SentencePiece leading space on the first output token is kept, as it is in the full text.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] | None = None,
                 skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = len(self._ids)  # everything before this has been emitted
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tok.decode(self._ids[start:end], skip_special_tokens=self._skip)

    def add(self, token_id: int) -> str:
        """Append one generated id; return the text it completes ("" while a character is partial)."""
        self._ids.append(token_id)
        text = self._decode(self._prefix_offset)
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        new = text[len(self._prefix_text):]
        # Slide the window: what was just emitted becomes the context for the next step.
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        return new

    def flush(self, drop_incomplete: bool = False) -> str:
        """At the end of generation: emit whatever was held back (even a truly invalid byte tail).

        drop_incomplete, when generation was cut (max_tokens, the context): leave out a last
        character whose bytes had only begun, rather than end the text with U+FFFD for it."""
        text = self._decode(self._prefix_offset)
        if drop_incomplete and text.endswith("\ufffd"):
            text = self._without_unfinished_tail(text)
        new = text[len(self._prefix_text):] if len(text) > len(self._prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._ids)
        self._prefix_text = ""
        return new

    def _without_unfinished_tail(self, text: str) -> str:
        pending = _unfinished_bytes(b"".join(map(self._tok.token_bytes, self._ids[self._read_offset:])))
        k = size = 0
        while size < pending:
            k += 1
            size += len(self._tok.token_bytes(self._ids[-k]))
        if pending and size == pending:  # the last k tokens hold just the unfinished bytes: decode without them
            return self._decode(self._prefix_offset, len(self._ids) - k)
        # a token that also holds whole characters (byte-level BPE): its lossy decode marks the tail once
        return text[:-1] if pending else text


def _unfinished_bytes(raw: bytes) -> int:
    """How many bytes at the end of raw begin a UTF-8 character that they do not complete."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(raw)
    return len(decoder.getstate()[0])
