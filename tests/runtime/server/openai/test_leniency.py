"""Unknown request fields: ignored and named by default (vLLM's leniency), 400s under --strict-api;
OpenAI fields the server cannot honour are 400s either way."""
import logging

import httpx
import pytest

from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine

CHAT = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
EXTRAS = {"store": False, "metadata": {"a": "b"}, "priority": 0,
          "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.fixture(scope="module", params=[False, True], ids=["lenient", "strict"])
def server(request):
    with live_server(tiny_engine(), strict_api=request.param) as srv:
        yield srv.url, request.param


@pytest.mark.parametrize("stream", [False, True])
def test_unknown_fields_are_ignored_and_named_or_refused_when_strict(server, stream, caplog):
    url, strict = server
    with caplog.at_level(logging.WARNING, logger="cute_serve"):
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, **EXTRAS, "stream": stream}, timeout=60)
    if strict:
        assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_parameter"
        assert r.json()["error"]["param"] == "store"
        return
    assert r.status_code == 200
    named = "store, metadata, priority, stream_options.continuous_usage_stats"
    assert r.headers["x-ignored-fields"] == named
    assert any("'store', 'metadata'" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize("body, param", [({"audio": {"voice": "x"}}, "audio"),
                                         ({"modalities": ["audio"]}, "modalities"),
                                         ({"functions": [{"name": "f"}]}, "functions")])
def test_openai_fields_the_server_cannot_honour_are_400(server, body, param):
    url, _ = server
    r = httpx.post(url + "/v1/chat/completions", json={**CHAT, **body}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_known_requests_name_nothing(server):
    url, _ = server
    r = httpx.post(url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "a", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and "x-ignored-fields" not in r.headers


def test_an_empty_field_name_is_named_in_a_legal_header(server):
    url, strict = server
    r = httpx.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 2, "0": None, "": None}, timeout=60)
    assert r.status_code == (400 if strict else 200)
    if not strict:
        assert r.headers["x-ignored-fields"] == '0, ""'
