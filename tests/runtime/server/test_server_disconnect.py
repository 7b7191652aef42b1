"""A client that leaves (mid-stream, while waiting for a JSON body, or while queued) aborts its request,
and every KV block comes back."""

import threading

import httpx
import pytest

from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

LONG = {"prompt": "a long answer please " * 4, "max_tokens": 800, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(max_num_seqs=2)) as srv:
        yield srv


def test_stream_cut_midway_aborts_and_frees_the_pool(server, monkeypatch):
    engine = server.engine
    aborts, generated = engine.stats.finished["abort"], engine.stats.generated_tokens
    # Steps past the first few tokens wait until the client has gone: on a fast machine the tiny model
    # would otherwise finish all 800 tokens before the client reads its second event.
    client_gone, step = threading.Event(), engine.step
    monkeypatch.setattr(engine, "step", lambda: (engine.stats.generated_tokens - generated < 4
                                                 or client_gone.wait(30)) and step())
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as r:
        events, lines = [], r.iter_lines()  # held: a dropped line iterator is finalized at `break` and closes
        for line in lines:  # the stream then, so the server could abort before the assert below
            if line.startswith("data: "):
                events.append(line)
            if len(events) == 2:
                break
        assert engine.pool.num_used > 0, (events, engine.stats.finished)
    # the connection is closed here, mid-stream
    client_gone.set()
    server.wait_idle(timeout=5)
    assert engine.pool.num_free == engine.pool.num_blocks
    assert engine.stats.finished["abort"] == aborts + 1
    assert engine.stats.generated_tokens - generated < 800


def test_non_streaming_client_timeout_aborts(server):
    engine = server.engine
    aborts = engine.stats.finished["abort"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(0.3, connect=5))
    server.wait_idle(timeout=5)
    assert engine.stats.finished["abort"] == aborts + 1


def test_queued_requests_that_leave_are_dropped_and_the_rest_finish(server):
    engine = server.engine
    aborts = engine.stats.finished["abort"]
    # two long streams fill the batch (max_num_seqs=2); a third waits in the queue, then leaves
    streams = [httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=60)
               for _ in range(2)]
    responses = [s.__enter__() for s in streams]
    iters = [r.iter_lines() for r in responses]
    for it in iters:
        next(it)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 3},
                   timeout=httpx.Timeout(0.3, connect=5))
    for s in streams:
        s.__exit__(None, None, None)
    server.wait_idle(timeout=5)
    assert engine.stats.finished["abort"] == aborts + 3
    r = httpx.post(server.url + "/v1/completions", json={**LONG, "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
