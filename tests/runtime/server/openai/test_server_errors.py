"""Every client mistake gets its 4xx, OpenAI's error shape and a message naming the problem; requests
in flight meanwhile are untouched, and the server answers correctly afterwards."""
import json
import threading

import httpx
import openai
import pytest

from tests.server_utils import TINY_MODEL, live_server, sse_payloads
from tests.tiny_engine import tiny_engine

MSGS = [{"role": "user", "content": "hi"}]
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"

# (route, body (a dict, or raw bytes), status, param, words the message must contain)
CASES = [
    (CMPL, b'{"prompt": "x", ', 400, None, ["not valid JSON"]),
    (CMPL, b"[1, 2]", 400, None, ["JSON object"]),
    (CMPL, b'{"prompt": "x", "temperature": NaN}', 400, "temperature", ["finite"]),
    (CMPL, {"prompt": "x", "max_tokens": "7"}, 400, "max_tokens", ["integer"]),
    (CMPL, {"prompt": "x", "max_tokens": False}, 400, "max_tokens", ["integer"]),
    (CMPL, {"prompt": "x", "n": True}, 400, "n", ["integer"]),
    (CMPL, {"prompt": "x", "temperature": True}, 400, "temperature", ["number"]),
    (CMPL, {"prompt": "x", "echo": 1}, 400, "echo", ["boolean"]),
    (CMPL, {"prompt": "x", "temperature": -0.5}, 400, "temperature", ["greater than or equal to 0"]),
    (CMPL, {"prompt": "x", "top_p": 0}, 400, "top_p", ["greater than 0"]),
    (CMPL, {"prompt": "x", "top_p": 1.5}, 400, "top_p", ["less than or equal to 1"]),
    (CMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", ["greater than or equal to 1"]),
    (CMPL, {"prompt": "x", "stop_token_ids": [999]}, 400, "stop_token_ids", ["999", "260"]),
    (CMPL, {"prompt": "x", "logit_bias": {"999": 5}}, 400, "logit_bias", ["999"]),
    (CMPL, {"prompt": "x", "logit_bias": {"abc": 5}}, 400, "logit_bias", ["abc"]),
    (CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs", ["20"]),
    (CMPL, {"prompt": "x", "stop": ["a"] * 17}, 400, "stop", ["16"]),
    (CMPL, {"prompt": "x", "top_k": 2**40}, 400, "top_k", ["less than or equal"]),
    (CMPL, {"prompt": [1, 999]}, 400, "prompt", ["999"]),
    (CMPL, {"prompt": []}, 400, "prompt", []),
    (CMPL, {"prompt": "x", "echo": True, "logprobs": 1}, 400, "echo", ["echo"]),
    (CMPL, {"prompt": [65] * 1000, "max_tokens": 100}, 400, "prompt", ["1000", "100", "1024"]),
    # longer than 1024 tokens of at most 4 characters (the byte tokenizer's "</s>"): refused untokenized
    (CMPL, {"prompt": "a" * 5000}, 400, "prompt", ["5000 characters", "1024"]),
    (CMPL, {"prompt": ["ok", "a" * 5000]}, 400, "prompt", ["5000 characters"]),
    (CHAT, {"messages": [{"role": "user", "content": "a" * 5000}]}, 400, "messages", ["characters", "1024"]),
    (CMPL, {"prompt": "x", "model": "gpt-4o"}, 404, "model", ["gpt-4o", TINY_MODEL]),
    # unknown fields are ignored unless --strict-api (tests/runtime/server/openai/test_leniency.py); unsupported OpenAI ones are 400s
    (CMPL, {"prompt": "x", "audio": {"voice": "x"}}, 400, "audio", ["not supported"]),
    (CMPL, {"max_tokens": 3}, 400, "prompt", ["prompt"]),
    (CHAT, {"messages": MSGS, "top_logprobs": 21, "logprobs": True}, 400, "top_logprobs", ["20"]),
    (CHAT, {"messages": MSGS, "top_logprobs": 2}, 400, "top_logprobs", ["logprobs"]),
    (CHAT, {"messages": []}, 400, "messages", ["at least 1"]),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", ["wizard"]),
    (CHAT, {"messages": MSGS, "max_completion_tokens": 5000}, 400, "messages", ["5000", "1024"]),
    (CHAT, {"messages": MSGS, "presence_penalty": 3}, 400, "presence_penalty", ["2"]),
    (CHAT, {"messages": MSGS, "model": "nope"}, 404, "model", ["nope"]),
    (CHAT, {}, 400, "messages", ["messages"]),
    (CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages.0.content", ["surrogate"]),
]


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine()) as srv:
        yield srv


def post(url, body, **kw):
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30, **kw)
    return httpx.post(url, json=body, timeout=30, **kw)


def test_every_mistake_gets_its_status_and_message_while_others_are_served(server):
    results = {}

    def background():  # a long stream in flight during the whole barrage
        body = {"prompt": "steady", "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + CMPL, json=body, timeout=60) as r:
            payloads = list(sse_payloads(r.iter_lines()))
        results["text"] = "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1])
        results["finish"] = json.loads(payloads[-2])["choices"][0]["finish_reason"]

    thread = threading.Thread(target=background)
    thread.start()
    for route, body, status, param, words in CASES:
        r = post(server.url + route, body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["param"] == param, (body, err)
        for w in words:
            assert w in err["message"], (body, err["message"])
        assert "\n" not in err["message"]
    thread.join(60)
    alone = httpx.post(server.url + CMPL, json={"prompt": "steady", "max_tokens": 60, "temperature": 0,
                                                "ignore_eos": True}, timeout=60).json()
    assert results["finish"] == "length" and results["text"] == alone["choices"][0]["text"]
    server.wait_idle()
    assert server.engine.stats.finished["abort"] == 0


def test_static_batching_defaults_max_tokens_to_what_its_kv_cache_can_reserve():
    with live_server(tiny_engine(num_blocks=32, scheduler="static")) as srv:  # 512 tokens of KV, context 1024
        r = post(srv.url + CHAT, {"messages": MSGS, "ignore_eos": True})
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 512
        assert post(srv.url + CHAT, {"messages": MSGS, "max_tokens": 600}).status_code == 400


def test_json_integers_may_be_written_as_floats(server):
    r = post(server.url + CMPL, {"prompt": "x", "max_tokens": 3.0, "n": 1.0, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_unknown_route_and_method_keep_the_error_shape(server):
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert httpx.get(server.url + CMPL).status_code == 405
    assert httpx.get(server.url + "/", follow_redirects=False).headers["location"] == "/docs"


def test_api_key():
    with live_server(tiny_engine(), api_key="s3cret") as srv:
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        wrong = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key" in wrong.json()["error"]["message"]
        # checked before the body: a bad body without a key is still a 401
        assert post(srv.url + CMPL, b"{oops").status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.completions.create(model=TINY_MODEL, prompt="x", max_tokens=2).usage.prompt_tokens == 1


def test_queue_full_is_429_with_retry_after_and_recovers():
    with live_server(tiny_engine(max_num_seqs=1), max_queue=0) as srv:
        body = {"prompt": "hold", "max_tokens": 500, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + CMPL, json=body, timeout=60) as r:
            lines = r.iter_lines()  # kept: dropping the iterator would close the connection
            next(lines)  # the first request is running
            full = post(srv.url + CMPL, {"prompt": "x", "max_tokens": 2})
            assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
            assert "capacity" in full.json()["error"]["message"]
            with pytest.raises(openai.RateLimitError):
                openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0).completions.create(
                    model=TINY_MODEL, prompt="x", max_tokens=2)
            assert post(srv.url + CMPL, {"prompt": "x", "n": 2}).status_code == 400  # can never fit
        srv.wait_idle()
        assert post(srv.url + CMPL, {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_a_stopped_engine_answers_503_on_health_and_requests():
    from runtime.server.app import create_app
    from runtime.server.async_engine import AsyncEngine
    from tests.server_utils import serve_app

    async_engine = AsyncEngine(tiny_engine())  # never started: the state after the engine thread died
    app = create_app(async_engine, TINY_MODEL)
    with serve_app(app) as url:
        health = httpx.get(url + "/health")
        sent = httpx.post(url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})
    app.state.server.close()
    for r in (health, sent):
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert "the engine is not running" in r.json()["error"]["message"]
