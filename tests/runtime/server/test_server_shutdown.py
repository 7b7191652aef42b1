"""SIGTERM / SIGINT to a real `python -m runtime.serve` (on a tiny model folder): requests in flight
past the grace period are aborted, yet every stream ends with a final "abort" chunk, an error event
and [DONE], every JSON client gets an OpenAI-shaped 503, new requests get 503 engine_unavailable,
and the process exits with status 0 without a traceback in its log."""
import json
import re
import signal
import tempfile
import threading
import time

import httpx
import pytest

from profiling.benchmarks.bench_serving import start_server, stop_server
from tests.server_utils import sse_payloads, wait_for_chat_page, write_tiny_model

LONG = {"max_tokens": 480, "ignore_eos": True, "temperature": 0}  # seconds of decoding: outlasts the grace


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny-model")))


@pytest.fixture
def serve(tiny_model):
    log = tempfile.TemporaryFile("w+")
    proc, url = start_server(["--model", tiny_model, "--kv-cache-memory", "8MiB", "--shutdown-grace", "1"], log, 120)

    def output() -> str:
        log.seek(0)
        return log.read()

    yield proc, url, output
    if proc.poll() is None:
        stop_server(proc)
    log.close()


def stream(url: str, path: str, body: dict, started: threading.Event, out: list) -> None:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        for payload in sse_payloads(r.iter_lines()):
            out.append(payload)
            started.set()


def test_sigterm_mid_stream_ends_every_stream_and_exits_0(serve):
    proc, url, output = serve
    streams = [("/v1/completions", {"prompt": f"story {i}", "n": 1 + i % 2, **LONG}) for i in range(3)]
    streams.append(("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **LONG,
                                              "stream_options": {"include_usage": True}}))
    events = [threading.Event() for _ in streams]
    outs: list[list[str]] = [[] for _ in streams]
    threads = [threading.Thread(target=stream, args=(url, path, body, ev, out))
               for (path, body), ev, out in zip(streams, events, outs)]
    answers: list[httpx.Response] = []
    threads.append(threading.Thread(target=lambda: answers.append(
        httpx.post(url + "/v1/completions", json={"prompt": "json", **LONG}, timeout=60))))
    for t in threads:
        t.start()
    assert all(ev.wait(30) for ev in events)  # every stream is generating
    proc.send_signal(signal.SIGTERM)
    refused = httpx.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 2}, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    assert httpx.get(url + "/health").status_code == 503  # a load balancer stops sending here
    for t in threads:
        t.join(60)
    assert proc.wait(30) == 0
    for out in outs:
        assert out[-1] == "[DONE]"
        error = json.loads(out[-2])["error"]
        assert error["code"] == "aborted" and "shutting down" in error["message"]
        finals = [c for p in out[:-2] for c in json.loads(p).get("choices", []) if c["finish_reason"]]
        assert finals and all(c["finish_reason"] == "abort" for c in finals)
    assert answers[0].status_code == 503
    assert set(answers[0].json()["error"]) == {"message", "type", "param", "code"}
    log = output()
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
    assert "aborting" in log


def test_sigint_when_idle_exits_0_at_once(serve):
    proc, url, output = serve
    assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    proc.send_signal(signal.SIGINT)
    assert proc.wait(15) == 0
    assert "Traceback" not in output()


def test_sigterm_during_a_grammar_compile_kills_it_answers_json_503_and_exits(serve):
    proc, url, output = serve
    wait_for_chat_page(url)  # its mount holds the event loop for seconds: not what this measures
    slow = {"prompt": "x", "max_tokens": 2, "guided_json": {"type": "string", "pattern": "^[a-z]{0,20000}$"}}
    answers: list[httpx.Response] = []
    client = threading.Thread(target=lambda: answers.append(httpx.post(url + "/v1/completions", json=slow, timeout=60)))
    client.start()
    deadline = time.monotonic() + 30
    while not re.search(r"^cute_serve:grammar_compiles_running\{[^}]*\} 1\.0$", httpx.get(url + "/metrics").text, re.M):
        assert time.monotonic() < deadline, "the compile never started"
        time.sleep(0.1)
    time.sleep(0.5)  # the ~30 s compile is under way in its worker
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    client.join(10)
    assert time.monotonic() - signalled < 8  # the grace (1 s), the kill, the flush: not the compile's 30 s
    assert answers[0].status_code == 503 and answers[0].headers["content-type"] == "application/json"
    assert answers[0].json()["error"]["code"] == "engine_unavailable"
    assert "Traceback" not in output(), output()[-3000:]
