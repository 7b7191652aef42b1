"""What a request may take from the server, on a real server: the default max_tokens, a request that
can never fit the KV cache, the body size and the time to send it; and the server flags (parsed
only: no model is loaded for them)."""
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from runtime.serve import parse_args, server_options
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

CMPL = "/v1/completions"


@pytest.fixture(scope="module")
def server():
    # 4 KV blocks: 64 tokens of KV under a 1024-token context
    with live_server(tiny_engine(num_blocks=4), default_max_tokens=20, max_request_bytes=64 * 1024,
                     body_timeout=0.5) as srv:
        yield srv


def test_flags_reach_the_server_options():
    args = parse_args(["--default-max-tokens", "7", "--max-request-bytes", "99", "--body-timeout", "3",
                       "--allowed-hosts", "box.lan", "--allowed-origins", "http://a.test", "--metrics-public",
                       "--shutdown-grace", "2.5"])
    opts = server_options(args)
    assert (opts.default_max_tokens, opts.max_request_bytes, opts.body_timeout) == (7, 99, 3)
    assert opts.metrics_public and args.shutdown_grace == 2.5
    assert opts.allowed_hosts == ("localhost", "127.0.0.1", "[::1]", "box.lan")
    assert opts.allowed_origins == ("http://a.test",)
    assert server_options(parse_args([])).default_max_tokens == 1024  # the README's number
    assert server_options(parse_args(["--host", "::1"])).allowed_hosts == ("localhost", "127.0.0.1", "[::1]")
    assert server_options(parse_args(["--host", "Box.LAN"])).allowed_hosts[-1] == "box.lan"
    assert server_options(parse_args(["--host", "0.0.0.0"])).allowed_hosts == ("localhost", "127.0.0.1", "[::1]")
    assert server_options(parse_args(["--reasoning-parser", "qwen3"])).reasoning_parser == "qwen3"
    assert parse_args(["--chat-template", "t.jinja", "--generation-config", "vllm"]).generation_config == "vllm"
    for bad in (["--default-max-tokens", "-1"], ["--max-request-bytes", "0"], ["--body-timeout", "0"],
                ["--shutdown-grace", "-1"], ["--reasoning-parser", "r2"], ["--generation-config", "model"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_default_max_tokens_is_the_flag_within_the_room_left(server):
    body = {"prompt": "abc", "ignore_eos": True}
    r = httpx.post(server.url + CMPL, json=body, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 20 and r["choices"][0]["finish_reason"] == "length"
    # 60 prompt tokens leave 4 of the 64 KV tokens: the default shrinks to fit instead of failing
    r = httpx.post(server.url + CMPL, json={"prompt": [65] * 60, "ignore_eos": True}, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 4


def test_a_request_that_can_never_fit_the_kv_cache_is_a_400_naming_both_numbers(server):
    r = httpx.post(server.url + CMPL, json={"prompt": [65] * 10, "max_tokens": 60}, timeout=30)
    assert r.status_code == 400, r.text  # was: 200, cut with "length" when it outgrew the pool
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert all(str(n) in err["message"] for n in (10, 60, 64)), err["message"]
    server.wait_idle()


def test_a_body_over_the_cap_is_413_declared_or_streamed(server):
    big = b'{"prompt": "' + b"a" * (100 * 1024) + b'"}'
    r = httpx.post(server.url + CMPL, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    r = httpx.post(server.url + CMPL, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "65536 bytes" in r.json()["error"]["message"]
    ok = httpx.post(server.url + CMPL, json={"prompt": "a", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200


def test_a_body_that_never_finishes_arriving_is_408(server):
    url = urlparse(server.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        start = time.monotonic()
        reply = b""
        while chunk := sock.recv(65536):  # until the server closes the connection
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
    assert time.monotonic() - start < 5
