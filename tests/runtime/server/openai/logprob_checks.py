"""What byte-exact logprobs promise, checked on a response: the tokens' bytes make up the text, the
offsets point into it, no top-logprob entry is lost to a key collision."""
from __future__ import annotations

import codecs


def token_bytes(token: str) -> bytes:
    """A completions `tokens` entry back to bytes: text, or vLLM's "bytes:\\xf0\\x9f"."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in token[len("bytes:"):].split("\\x")[1:])
    return token.encode("utf-8")


def as_text(raw: bytes) -> str:
    """The text a length-cut output shows for raw: lossy UTF-8, an unfinished last character dropped."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(raw)


def check_completion(text: str, lp: dict, top: int) -> None:
    raw = b"".join(token_bytes(t) for t in lp["tokens"])
    assert as_text(raw) == text, (raw, text)
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets), (offsets, len(text))
    # each token starts where the text of the tokens before it ends
    assert offsets == [len(as_text(b"".join(token_bytes(t) for t in lp["tokens"][:i]))) for i in range(len(offsets))]
    assert all(len(d) == top for d in lp["top_logprobs"]), lp["top_logprobs"]


def check_chat(content: str, lp: dict, top: int) -> None:
    entries = lp["content"]
    assert as_text(b"".join(bytes(e["bytes"]) for e in entries)) == content
    for e in entries:
        assert token_bytes(e["token"]) == bytes(e["bytes"])
        assert len(e["top_logprobs"]) == top
        assert len({bytes(t["bytes"]) for t in e["top_logprobs"]}) == top  # n different tokens, n different bytes
