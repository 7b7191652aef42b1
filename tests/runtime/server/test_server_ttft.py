"""The first streamed chunk carries the first token, so a load tester timing it (vLLM's bench serve,
genai-perf, guidellm: the first chunk with choices) measures the engine's own TTFT."""
import json
import time

import httpx

from tests.runtime.server.test_server_metrics import V, scrape, value
from tests.server_utils import TINY_MODEL, live_server, sse_payloads
from tests.tiny_engine import tiny_engine

STEP_SECONDS = 0.3  # each engine step made this slow: a TTFT that can be told apart from the HTTP round trip


def _slow_engine():
    engine = tiny_engine()
    step = engine.step

    def slow_step():
        time.sleep(STEP_SECONDS)
        return step()

    engine.step = slow_step
    return engine


def test_the_first_chat_chunk_comes_with_the_first_token_at_the_engines_ttft():
    with live_server(_slow_engine()) as srv:
        body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "ignore_eos": True, "stream": True,
                "logprobs": True}
        httpx.post(srv.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=60)  # warm-up
        srv.wait_idle()
        warm_ttft = value(scrape(srv.url), V + "time_to_first_token_seconds_sum")
        start = time.perf_counter()
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            payloads = sse_payloads(r.iter_lines())
            for payload in payloads:
                chunk = json.loads(payload)
                if chunk.get("choices"):  # vLLM bench serve's first token
                    first_chunk = time.perf_counter() - start, chunk["choices"][0]
                    break
            list(payloads)  # read to the end: an aborted request is not in the histogram
        srv.wait_idle()
        engine_ttft = value(scrape(srv.url), V + "time_to_first_token_seconds_sum") - warm_ttft
    client_ttft, choice = first_chunk
    # the role with the first token (its text may still be empty: a byte of a longer character)
    assert choice["delta"]["role"] == "assistant" and len(choice["logprobs"]["content"]) == 1, choice
    assert engine_ttft >= STEP_SECONDS
    assert abs(client_ttft - engine_ttft) < STEP_SECONDS / 2, (client_ttft, engine_ttft)  # before: ~0 against >= 0.3
