"""Every string field of both generation routes, the tools API and /tokenize, each replaced in turn by
a lone surrogate, a NUL, and deep nesting (and each free-form key by a surrogate): the answer is a
4xx (a 400 naming the field for surrogates and nesting), never a 5xx, and the engine keeps serving."""
import json
from typing import Any, Iterator

import httpx
import pytest

from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine

SCHEMA = {"type": "object", "description": "d", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]},
                                                                "note": {"type": "string", "pattern": "^[a-z]{0,4}$"}},
          "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": SCHEMA}}
PAST_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": json.dumps({"city": "Oslo", "deep": [["x"]]})}}
MESSAGES = [{"role": "system", "content": "be brief", "name": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": "calling", "tool_calls": [PAST_CALL], "reasoning_content": "hmm"},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
            {"role": "user", "content": "and now?"}]
COMMON = {"model": TINY_MODEL, "max_tokens": 2, "user": "u1", "stop": ["zz", "yy"], "logit_bias": {"5": 1.0},
          "unknown_extra": "ignored"}
BODIES = [
    ("/v1/completions", {**COMMON, "prompt": "hi", "guided_regex": "[a-c]{2}"}),
    ("/v1/completions", {**COMMON, "prompt": ["hi", "yo"], "guided_grammar": 'root ::= "a" [b-c]'}),
    ("/v1/completions", {**COMMON, "prompt": "hi", "guided_choice": ["yes", "no"]}),
    ("/v1/completions", {**COMMON, "prompt": "hi", "guided_json": SCHEMA}),
    ("/v1/completions", {**COMMON, "prompt": "hi", "guided_json": json.dumps(SCHEMA)}),
    ("/v1/chat/completions", {**COMMON, "messages": MESSAGES, "tools": [TOOL],
                              "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                              "chat_template_kwargs": {"flag": "on", "nested": {"k": ["v"]}}}),
    ("/v1/chat/completions", {**COMMON, "messages": MESSAGES, "tools": [TOOL], "tool_choice": "required"}),
    ("/v1/chat/completions", {**COMMON, "messages": MESSAGES[:2], "response_format": {
        "type": "json_schema", "json_schema": {"name": "w", "description": "weather", "schema": SCHEMA}}}),
    ("/tokenize", {"model": TINY_MODEL, "messages": MESSAGES, "chat_template_kwargs": {"flag": "on"}}),
    ("/tokenize", {"model": TINY_MODEL, "prompt": "hello"}),
]
SURROGATE, NUL = "a\ud800b", "a\x00b"
DEEP: Any = "x"
for _ in range(200):
    DEEP = [DEEP]
FREE_FORM_KEYS = ("properties", "chat_template_kwargs", "nested", "logit_bias")  # maps whose keys a client names


def leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, bool]]:
    """(path, is_key) of every string value and every key of a free-form map, in the body."""
    if isinstance(node, str):
        yield path, False
    elif isinstance(node, dict):
        for k, v in node.items():
            if path and path[-1] in FREE_FORM_KEYS:
                yield path + (k,), True
            yield from leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, path + (i,))


def replaced(body: Any, path: tuple, value: Any, key: bool) -> Any:
    body = json.loads(json.dumps(body))
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    if key:
        parent[value] = parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return body


def cases() -> Iterator[tuple[str, dict, str, str]]:
    for route, body in BODIES:
        for path, key in leaves(body):
            where = ".".join(map(str, path))
            if key:
                yield route, replaced(body, path, SURROGATE, True), where, "key"
                continue
            for name, poison in (("surrogate", SURROGATE), ("nul", NUL), ("deep", DEEP)):
                yield route, replaced(body, path, poison, False), where, name
            if path[-1] == "arguments":  # JSON text the server parses: deep nesting inside the string
                yield route, replaced(body, path, json.dumps({"a": DEEP}), False), where, "deep-json"


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(num_blocks=256)) as srv:
        yield srv


def test_every_string_field_with_a_surrogate_nul_or_deep_nesting_is_a_4xx_never_a_5xx(server):
    failures, checked = [], 0
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for route, body in BODIES:  # each template itself is served
            r = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == 200, (route, r.text)
        for route, body, where, poison in cases():
            try:
                r = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
            except httpx.TransportError as exc:  # a dropped connection is no better than a 500
                failures.append((route, where, poison, repr(exc)))
                continue
            checked += 1
            strict = poison in ("surrogate", "key", "deep", "deep-json") and not where.startswith("unknown_extra")
            if r.status_code >= 500 or (strict and r.status_code != 400):
                failures.append((route, where, poison, r.status_code, r.text[:200]))
            elif r.status_code == 400 and strict and r.json()["error"]["param"] is None:
                failures.append((route, where, poison, "no param", r.text[:200]))
    assert checked > 300 and not failures, failures[:10]
    server.wait_idle()
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "still", "max_tokens": 2}).status_code == 200
