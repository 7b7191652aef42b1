"""The issue's 27-byte ambiguous grammar on a real server: its token masks grow without bound, and once
held every other client's 4-token completion for tens of seconds. Now the request is stopped with a
400 (streamed: an error event) naming the flag, and plain requests beside it keep their pace. A tiny
random model over the default model's real 49k vocabulary: its many multi-letter tokens are what make
the masks blow up (the byte tokenizer's never do)."""
import json
import threading
import time

import httpx
import pytest

from runtime.tokenizer.tokenizer import Tokenizer
from tests.server_utils import TINY_MODEL, live_server, sse_payloads
from tests.tiny_engine import tiny_engine
from weights.default import default_model_path

AMBIGUOUS = 'root ::= e\ne ::= e e e | e e | [a-z] | ""'
HOSTILE = {"model": TINY_MODEL, "prompt": "Write something.", "guided_grammar": AMBIGUOUS, "max_tokens": 200,
           "min_tokens": 200, "temperature": 1.0, "seed": 0}


@pytest.fixture(scope="module")
def server():
    engine = tiny_engine(tokenizer=Tokenizer.from_gguf(default_model_path()), num_blocks=512)
    with live_server(engine) as srv:
        warm = {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}
        for extra in ({}, {"guided_regex": "[a-z]+"}):  # first forwards; the compile workers up
            assert httpx.post(srv.url + "/v1/completions", json={**warm, **extra}, timeout=120).status_code == 200
        yield srv


def plain_latencies(server, stop: threading.Event, seconds: list[float]) -> None:
    """4-token completions one after another until stop, each one's seconds appended."""
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            started = time.monotonic()
            r = client.post(server.url + "/v1/completions",
                            json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
            seconds.append(time.monotonic() - started)


def test_a_grammar_whose_masks_blow_up_is_stopped_and_others_keep_their_pace(server):
    seconds: list[float] = []
    stop = threading.Event()
    plain = threading.Thread(target=plain_latencies, args=(server, stop, seconds))
    plain.start()
    try:
        started = time.monotonic()
        r = httpx.post(server.url + "/v1/completions", json=HOSTILE, timeout=120)
        hostile_seconds = time.monotonic() - started
    finally:
        stop.set()
        plain.join()
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "grammar_too_slow" and error["param"] == "guided_grammar", error
    assert "--max-mask-wait-ms" in error["message"] or "--max-mask-cpu-ms" in error["message"]
    assert hostile_seconds < 30  # it did not run its 200 tokens at the masks' growing cost
    assert seconds and max(seconds) < 3, seconds  # once up to 44.5 s
    server.wait_idle()


def test_streamed_it_ends_with_an_error_event_and_no_finish_reason(server):
    with httpx.stream("POST", server.url + "/v1/completions", json={**HOSTILE, "seed": 1, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        payloads = list(sse_payloads(r.iter_lines()))
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    assert events[-1]["error"]["code"] == "grammar_too_slow"
    assert all(c["finish_reason"] is None for e in events[:-1] for c in e.get("choices", []))
    server.wait_idle()
