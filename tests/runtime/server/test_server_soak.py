"""Soak: many short requests (streaming and not, chat and completions) with 20% of clients cutting the
stream at a random point. Every request that was not cut gets a complete answer with a finish reason;
at the end no KV block is leaked and the engine counted each request exactly once.

The CI version sends 200 requests; the full 2,000 runs with `pytest -m slow` or CUTE_SERVE_FULL_SOAK=1.
"""
import asyncio
import json
import os
import random

import httpx
import pytest

from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

CUT_FRACTION = 0.2
CONCURRENCY = 24


def full_soak_enabled(config) -> bool:
    return "slow" in (config.getoption("markexpr") or "") or os.environ.get("CUTE_SERVE_FULL_SOAK") == "1"


def make_request(rng: random.Random, i: int) -> dict:
    chat = rng.random() < 0.5
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "kv", "block"]) for _ in range(rng.randint(1, 12)))
    body = {"max_tokens": rng.randint(1, 12), "temperature": rng.choice([0, 0.7, 1.0]), "seed": i,
            "ignore_eos": rng.random() < 0.7, "stream": rng.random() < 0.9}
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(["a", "ab", "\n"])]
    if chat:
        body["messages"] = [{"role": "user", "content": words}]
    else:
        body["prompt"] = words
    return {"path": "/v1/chat/completions" if chat else "/v1/completions", "body": body,
            "cut_after": rng.randint(0, 4) if body["stream"] and rng.random() < CUT_FRACTION else None}


def finish_of(payload: dict) -> str | None:
    choice = payload["choices"][0] if payload.get("choices") else None
    return choice and choice.get("finish_reason")


async def run_one(client: httpx.AsyncClient, req: dict) -> dict:
    body = req["body"]
    if not body["stream"]:
        r = await client.post(req["path"], json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        return {"cut": False, "finish": out["choices"][0]["finish_reason"], "done": True,
                "tokens": out["usage"]["completion_tokens"]}
    finish, done, events = None, False, 0
    async with client.stream("POST", req["path"], json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if req["cut_after"] is not None and events >= req["cut_after"]:
                return {"cut": True}  # leaving the block closes the connection mid-stream
            events += 1
            if line == "data: [DONE]":
                done = True
                continue
            payload = json.loads(line[6:])
            assert "error" not in payload, payload
            finish = finish_of(payload) or finish
    return {"cut": req["cut_after"] is not None, "finish": finish, "done": done, "tokens": None}


async def soak(url: str, requests: list[dict]) -> list[dict]:
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def bounded(req):
            async with gate:
                return await run_one(client, req)
        return await asyncio.gather(*(bounded(r) for r in requests))


@pytest.mark.parametrize("num_requests", [200, pytest.param(2000, marks=pytest.mark.slow)])
def test_soak_with_random_disconnects(num_requests, request):
    if num_requests > 200 and not full_soak_enabled(request.config):
        pytest.skip("the full soak runs with -m slow or CUTE_SERVE_FULL_SOAK=1")
    rng = random.Random(num_requests)
    requests = [make_request(rng, i) for i in range(num_requests)]
    with live_server(tiny_engine(num_blocks=96, max_num_seqs=16)) as srv:
        results = asyncio.run(soak(srv.url, requests))
        srv.wait_idle(timeout=20)
        engine = srv.engine
        pool = engine.pool
        assert pool.num_free == pool.num_blocks and all(r == 0 for r in pool.ref_counts)
        assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.requests
        assert srv.async_engine.num_seqs_in_flight == 0
        finished = engine.stats.finished
        assert sum(finished.values()) == num_requests  # each request ended exactly once
        cut = sum(r["cut"] for r in results)
        assert finished["abort"] <= cut
        metrics = httpx.get(srv.url + "/metrics").text
    assert 0.1 * num_requests < cut < 0.3 * num_requests
    for req, res in zip(requests, results):
        if res["cut"]:
            continue
        assert res["done"], req
        assert res["finish"] in ("stop", "length"), (req, res)
        if res["tokens"] is not None and res["finish"] == "length":
            assert res["tokens"] == req["body"]["max_tokens"]
    abort = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"}'
    assert f'{abort} {float(finished["abort"])}' in metrics
