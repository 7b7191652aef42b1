"""Engine logprob records -> OpenAI's two shapes (legacy completions, and chat's content list).

A token is shown by its raw bytes (the tokenizer's, not a decode of it alone, which turns every
piece of a multi-byte character into U+FFFD): as text when they are whole UTF-8, else as vLLM
writes them, "bytes:\\xf0\\x9f". text_offset counts characters of the real output text.
"""
from __future__ import annotations

import codecs
import math
from typing import Any

from runtime.tokenizer.tokenizer import Tokenizer

# JSON has no -Infinity: a token the model gives probability 0 gets vLLM's stand-in.
FLOOR = -9999.0
Record = tuple[float, list[tuple[int, float]]]  # (chosen token's logprob, [(token, logprob), ...])


def _finite(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


class TextOffsets:
    """Where each next token starts in a choice's text, across a stream's deltas: its bytes go
    through one incremental UTF-8 decoder, so a character split over tokens counts once."""

    def __init__(self, tokenizer: Tokenizer, start: int = 0, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.position = start
        self.skip_special = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def take(self, token_id: int) -> int:
        """The offset of token_id; moves past the characters it completes."""
        offset = self.position
        if not (self.skip_special and self.tokenizer.is_special(token_id)):  # absent from the text
            self.position += len(self._decoder.decode(self.tokenizer.token_bytes(token_id)))
        return offset


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        """The token's text when its bytes are whole UTF-8, else "bytes:\\xNN..." (as vLLM)."""
        t = self._texts.get(token_id)
        if t is None:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                t = raw.decode("utf-8")
            except UnicodeDecodeError:
                t = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._texts[token_id] = t
        return t

    def offsets(self, start: int = 0, skip_special_tokens: bool = True) -> TextOffsets:
        return TextOffsets(self.tokenizer, start, skip_special_tokens)

    def _top(self, alternatives: list[tuple[int, float]]) -> dict[str, float]:
        """Keyed by text; two tokens with the same text (rare: same bytes) keep apart as token_id:N."""
        out: dict[str, float] = {}
        for token, lp in alternatives:
            key = self.text(token)
            out[f"token_id:{token}" if key in out else key] = _finite(lp)
        return out

    def completion(self, token_ids: list[int], records: list[Record], offsets: TextOffsets) -> dict[str, Any]:
        return {"tokens": [self.text(t) for t in token_ids], "token_logprobs": [_finite(r[0]) for r in records],
                "top_logprobs": [self._top(r[1]) for r in records],
                "text_offset": [offsets.take(t) for t in token_ids]}

    def chat(self, token_ids: list[int], records: list[Record]) -> dict[str, Any]:
        def entry(token: int, lp: float) -> dict[str, Any]:
            return {"token": self.text(token), "logprob": _finite(lp), "bytes": list(self.tokenizer.token_bytes(token))}

        return {"content": [{**entry(t, r[0]), "top_logprobs": [entry(u, lp) for u, lp in r[1]]}
                            for t, r in zip(token_ids, records)]}
