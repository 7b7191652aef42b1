"""Engine logprob records -> OpenAI's two shapes (legacy completions, and chat's content list)."""
from __future__ import annotations

import math
from typing import Any

from runtime.tokenizer.tokenizer import Tokenizer

# JSON has no -Infinity: a token the model gives probability 0 gets vLLM's stand-in.
FLOOR = -9999.0
Record = tuple[float, list[tuple[int, float]]]  # (chosen token's logprob, [(token, logprob), ...])


def _finite(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        t = self._texts.get(token_id)
        if t is None:
            t = self._texts[token_id] = self.tokenizer.decode([token_id])
        return t

    def completion(self, token_ids: list[int], records: list[Record], text_offset: int = 0) -> dict[str, Any]:
        tokens = [self.text(t) for t in token_ids]
        offsets = []
        for tok in tokens:
            offsets.append(text_offset)
            text_offset += len(tok)
        return {"tokens": tokens, "token_logprobs": [_finite(r[0]) for r in records],
                "top_logprobs": [{self.text(t): _finite(lp) for t, lp in r[1]} for r in records],
                "text_offset": offsets}

    def chat(self, token_ids: list[int], records: list[Record]) -> dict[str, Any]:
        def entry(token: int, lp: float) -> dict[str, Any]:
            text = self.text(token)
            return {"token": text, "logprob": _finite(lp), "bytes": list(text.encode("utf-8"))}

        return {"content": [{**entry(t, r[0]), "top_logprobs": [entry(u, lp) for u, lp in r[1]]}
                            for t, r in zip(token_ids, records)]}
