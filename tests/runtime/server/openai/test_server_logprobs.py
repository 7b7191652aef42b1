"""Byte-level tokens on a real server: a random tiny byte model writes bytes >= 0x80 that are pieces
of (or not even) UTF-8 characters. Each token's logprobs show its own bytes; a length cut in the
middle of a character leaves it out rather than end the text with U+FFFD."""
import json

import httpx
import pytest

from tests.runtime.server.openai.logprob_checks import check_chat, check_completion
from tests.server_utils import live_server, sse_payloads
from tests.tiny_engine import tiny_engine

TOP = 5
SAMPLED = {"max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine()) as srv:
        yield srv


def test_completion_tokens_are_their_bytes_and_offsets_point_into_the_text(server):
    body = {"prompt": "x", "logprobs": TOP, **SAMPLED}
    choice = httpx.post(server.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert any(t.startswith("bytes:\\x") for t in choice["logprobs"]["tokens"])  # pieces of characters came out
    check_completion(choice["text"], choice["logprobs"], TOP)
    # streamed: the same tokens, offsets counted on across the deltas
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        chunks = [json.loads(p)["choices"][0] for p in sse_payloads(r.iter_lines()) if p != "[DONE]"]
    merged = {key: [x for c in chunks if c["logprobs"] for x in c["logprobs"][key]] for key in choice["logprobs"]}
    assert "".join(c["text"] for c in chunks) == choice["text"] and merged == choice["logprobs"]


def test_chat_bytes_are_the_tokens_bytes(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": TOP, **SAMPLED}
    choice = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
    assert any(bytes(e["bytes"]) != b"\xef\xbf\xbd" and e["bytes"][0] >= 0x80 for e in choice["logprobs"]["content"])
    check_chat(choice["message"]["content"], choice["logprobs"], TOP)


@pytest.mark.parametrize("stream", [False, True])
def test_a_length_cut_inside_a_character_drops_it(server, stream):
    body = {"prompt": "x", "max_tokens": 2, "logit_bias": {str(0xF0): 100}, "logprobs": 0, "stream": stream}  # "\xf0\xf0"
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    payloads = list(sse_payloads(r.text.splitlines()))[:-1] if stream else [r.text]
    chunks = [c for p in payloads for c in json.loads(p)["choices"]]
    assert "".join(c["text"] for c in chunks) == "\ufffd"  # the first 0xF0 is invalid, the second unfinished
    assert [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]] == ["bytes:\\xf0"] * 2
