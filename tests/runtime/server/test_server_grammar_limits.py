"""A real server's structured output under hostile grammars: size and time limits are 400s naming the
limit, a compile stops when its client leaves (no CPU burnt after), unenforceable schema keywords
are refused unless strict: false (then named in a header), finish_reason only takes OpenAI's
values, and /metrics shows the compiled-grammar cache's bytes."""
import json
import threading
import time

import httpx
import psutil
import pytest

from structured.limits import GrammarLimits
from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine

SLOW_SCHEMA = {"type": "string", "pattern": "^[a-z]{0,20000}$"}  # 50 bytes, ~30 s to compile
ENUM_20K = {"type": "object", "properties": {"a": {"enum": [f"value-{i:06d}-abcdefghij" for i in range(20_000)]}}}


@pytest.fixture(scope="module")
def server():
    limits = GrammarLimits(compile_seconds=1.5, compile_workers=1, cache_bytes=4 * 2**20)
    with live_server(tiny_engine(num_blocks=256), grammar=limits) as srv:
        yield srv


def post(server, body: dict, path: str = "/v1/completions", timeout: float = 60) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 4, **body},
                      timeout=timeout)


def chat(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=60,
                      json={"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            **body})


@pytest.mark.parametrize("body, param, words", [
    ({"guided_json": ENUM_20K}, "guided_json", "--max-grammar-bytes"),
    ({"guided_json": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40_000)}}},
     "guided_json", "--max-grammar-bytes"),  # a 1.3 MB schema
    ({"guided_choice": ["x" * 2048] * 256}, "guided_choice", "--max-grammar-bytes"),
    ({"guided_choice": ["y" * 100 + str(i) for i in range(200)]}, "guided_choice", "at most 15000 characters"),
    ({"guided_json": {"enum": [str(i) for i in range(1001)]}}, "guided_json", "at most 1000"),
    ({"guided_json": SLOW_SCHEMA}, "guided_json", "--max-grammar-compile-seconds"),
])
def test_a_grammar_over_a_limit_is_a_400_naming_it(server, body, param, words):
    started = time.monotonic()
    r = post(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and words in r.json()["error"]["message"]
    assert time.monotonic() - started < 8
    server.wait_idle()


def test_a_compile_stops_when_its_client_leaves(server):
    schema = {"type": "string", "pattern": "^[a-y]{0,20000}$"}  # not the one above: nothing cached
    with pytest.raises(httpx.ReadTimeout):
        post(server, {"guided_json": schema}, timeout=0.5)
    time.sleep(0.5)  # the server sees the disconnect and kills the compile
    assert _cpu_seconds(1.0) < 0.3  # nothing in this process or its children still compiles
    assert post(server, {"guided_regex": "[ab]{3}"}, timeout=10).status_code == 200


def test_while_the_engine_has_requests_a_compile_worker_is_held_to_its_share(server):
    schema = {"type": "string", "pattern": "^[a-x]{0,20000}$"}  # slow, and not cached by another test
    assert post(server, {"guided_regex": "[xy]{2}"}).status_code == 200  # the workers are up
    done = threading.Event()

    def keep_busy():
        while not done.is_set():
            assert post(server, {"max_tokens": 1000, "ignore_eos": True}).status_code == 200

    plain = threading.Thread(target=keep_busy)
    plain.start()
    time.sleep(0.2)
    hostile = threading.Thread(target=post, args=(server, {"guided_json": schema}))
    hostile.start()
    seen, deadline = set(), time.monotonic() + 1.2
    while time.monotonic() < deadline:
        for child in psutil.Process().children(recursive=True):
            try:
                seen.add(child.status())
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.003)
    done.set()
    hostile.join(), plain.join()
    assert psutil.STATUS_STOPPED in seen  # the governor's duty cycle (structured/compile_governor.py)
    server.wait_idle()
    time.sleep(0.1)  # past the duty cycle's off phase: an idle engine leaves the workers running
    assert not any(c.status() == psutil.STATUS_STOPPED for c in psutil.Process().children(recursive=True))


def test_keywords_the_grammar_cannot_enforce_are_a_400_unless_strict_false(server):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}},
              "required": ["n"], "allOf": [{"required": ["n"]}]}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = chat(server, {"response_format": fmt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert "allOf at /" in r.json()["error"]["message"] and "multipleOf at /properties/n" in r.json()["error"]["message"]
    r = chat(server, {"response_format": {**fmt, "json_schema": {**fmt["json_schema"], "strict": False}}})
    assert r.status_code == 200
    assert r.headers["x-unenforced-schema-keywords"] == "allOf at /, multipleOf at /properties/n"
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    named = {"type": "function", "function": {"name": "f"}}
    assert chat(server, {"tools": [tool], "tool_choice": named}).status_code == 400
    tool["function"]["strict"] = False
    r = chat(server, {"tools": [tool], "tool_choice": named})
    assert r.status_code == 200 and "multipleOf" in r.headers["x-unenforced-schema-keywords"]


def test_ignore_eos_with_a_choice_ends_with_stop_and_says_why(server):
    for stream in (False, True):
        r = post(server, {"guided_choice": ["yes", "no"], "ignore_eos": True, "max_tokens": 20, "stream": stream})
        assert r.status_code == 200
        choices = [json.loads(line[6:])["choices"][0] for line in r.text.splitlines()
                   if line.startswith("data: {")] if stream else r.json()["choices"]
        final = next(c for c in choices if c["finish_reason"])
        assert final["finish_reason"] == "stop" and final["stop_reason"] is None
        assert "grammar is complete" in final["finish_details"]["reason"]
        assert "".join(c["text"] for c in choices) in ("yes", "no")


def test_metrics_show_the_grammar_cache_in_bytes(server):
    for i in range(3):
        assert post(server, {"guided_regex": f"[a-c]{{{i + 1}}}x"}).status_code == 200
    text = httpx.get(server.url + "/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("cute_serve:grammar_cache_bytes{"))
    assert 0 < float(line.split()[1]) <= 4 * 2**20


def _cpu_seconds(window: float) -> float:
    """CPU seconds this process and all its descendants use over the next `window` seconds."""
    def total() -> float:
        seconds = 0.0
        for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
            try:
                seconds += sum(p.cpu_times()[:2])
            except psutil.NoSuchProcess:  # ended meanwhile
                pass
        return seconds

    before = total()
    threading.Event().wait(window)
    return total() - before
