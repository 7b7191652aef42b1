"""`--log-format json`: one JSON line per HTTP request (request id, route, status, tokens, TTFT, e2e,
client disconnects), the refused ones included; never the request's text unless `--log-prompts`."""
import json
import logging
import socket
import time

import httpx
import pytest

from runtime.server.request_log import ACCESS_LOGGER, HttpRecord, access_line
from tests.server_utils import live_server, sse_payloads
from tests.tiny_engine import tiny_engine

SECRET = "SECRET-PROMPT-TEXT"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))

    def wait(self, count: int, timeout: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.lines) >= count, self.lines
        return self.lines


@pytest.fixture
def access():
    handler = Lines()
    log = logging.getLogger(ACCESS_LOGGER)
    log.addHandler(handler)
    yield handler
    log.removeHandler(handler)


def test_a_line_per_request_with_tokens_and_latencies_but_no_text(access):
    with live_server(tiny_engine(num_blocks=64), log_format="json", api_key="k") as srv:
        key = {"Authorization": "Bearer k", "X-Request-Id": "client-7"}
        body = {"prompt": SECRET, "max_tokens": 3, "ignore_eos": True}
        reply = httpx.post(srv.url + "/v1/completions", json=body, headers=key, timeout=30).json()
        chat = {"messages": [{"role": "user", "content": SECRET}], "max_tokens": 2, "stream": True}
        assert httpx.post(srv.url + "/v1/chat/completions", json=chat, headers=key, timeout=30).status_code == 200
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "temperature": -1},
                          headers=key).status_code == 400
        assert httpx.get(srv.url + "/v1/models").status_code == 401  # refused by the key guard: still logged
        lines = access.wait(4)
    first, stream, bad, refused = lines
    assert first["request_id"] == reply["id"] and first["x_request_id"] == "client-7"
    assert (first["method"], first["route"], first["status"], first["model"]) == ("POST", "/v1/completions", 200, "tiny")
    assert first["prompt_tokens"] == reply["usage"]["prompt_tokens"] and first["completion_tokens"] == 3
    assert first["cached_tokens"] == 0 and first["finish_reasons"] == ["length"]
    assert 0 < first["ttft_s"] <= first["e2e_s"] <= first["duration_s"] and first["client_disconnected"] is False
    assert stream["route"] == "/v1/chat/completions" and stream["completion_tokens"] == 2
    assert stream["request_id"].startswith("chatcmpl-")
    assert bad["status"] == 400 and "prompt_tokens" not in bad  # refused before the engine
    assert refused["status"] == 401 and refused["path"] == "/v1/models"
    assert all(SECRET not in json.dumps(line) and "prompt" not in line for line in lines)


def test_log_prompts_adds_the_request_text(access):
    with live_server(tiny_engine(num_blocks=64), log_format="json", log_prompts=True) as srv:
        messages = [{"role": "user", "content": SECRET}]
        assert httpx.post(srv.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 1}).status_code == 200
        assert httpx.post(srv.url + "/v1/completions", json={"prompt": SECRET, "max_tokens": 1}).status_code == 200
        chat, completion = access.wait(2)
    assert chat["prompt"] == messages and completion["prompt"] == SECRET


def test_client_disconnects_are_logged(access):
    with live_server(tiny_engine(num_blocks=64), log_format="json") as srv:
        body = {"prompt": [1] * 20, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            next(sse_payloads(r.iter_lines()))  # a token came: then the client goes away
        # a whole-body request whose client leaves before the answer: 499, as nginx logs it
        host, port = srv.url.removeprefix("http://").split(":")
        payload = json.dumps({"prompt": [1] * 20, "max_tokens": 400, "ignore_eos": True}).encode()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            time.sleep(0.5)
        streamed, whole = access.wait(2)
        srv.wait_idle()
    assert streamed["client_disconnected"] is True and streamed["status"] == 200
    assert streamed["finish_reasons"] == ["abort"] and 0 < streamed["completion_tokens"] < 400
    assert whole["client_disconnected"] is True and whole["status"] == 499 and whole["finish_reasons"] == ["abort"]


def test_duration_ends_with_the_response_not_when_the_line_is_written():
    """The line may wait for the engine's last output (or the give-up, 30 s): duration_s is the HTTP request's."""
    rec = HttpRecord("POST", "/v1/completions", "127.0.0.1", {}, started=10.0)
    rec.ended = 10.25
    assert access_line(rec)["duration_s"] == 0.25
