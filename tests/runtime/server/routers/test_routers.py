"""Two CPU replicas (one thread each) behind the routers people run, on 127.0.0.1: vllm-router's kv_aware
policy learns where each prefix's KV is from our KV events alone; SGLang's cache_aware keeps a prefix
where it first sent it; vllm-router's round_robin routes around a replica that is killed mid-load and
sends to it again once it is back."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from profiling.common.router_fleet import fleet
from tests.server_utils import write_tiny_model

PREFIX_A = "System: you answer questions about rivers, the mountains they come from and the sea. " * 2
PREFIX_B = "System: you write short poems about kernels, caches and the memory between them. " * 2
REQUESTS, DONE = "vllm:request_success_total", "vllm:prefix_cache_hits_total"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    model = write_tiny_model(str(tmp_path_factory.mktemp("tiny")))
    with fleet(model, ("kv_aware", "round_robin", "sglang:cache_aware"), extra=("--shutdown-grace", "0", "--kv-cache-memory", "64MiB"),
               timeout=90) as f:
        yield f


def complete(url: str, prompt: str, max_tokens: int = 2) -> int:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    try:
        return httpx.post(url + "/v1/completions", json=body, timeout=60).status_code
    except httpx.HTTPError:
        return 0


def counts(replica) -> tuple[float, float]:
    m = replica.metrics()
    return m.get(REQUESTS, 0.0), m.get(DONE, 0.0)


def test_kv_aware_sends_a_prefix_where_the_replica_events_say_it_is(replicas):
    r0, r1 = replicas.replicas
    (n0, h0), (n1, h1) = counts(r0), counts(r1)
    # straight to the replicas, not through the router: only their KV events can tell it where A and B are
    assert complete(r1.url, PREFIX_A + "user 0") == 200 and complete(r0.url, PREFIX_B + "user 0") == 200
    time.sleep(1.0)  # the events' way to the router: ZMQ on this machine, milliseconds
    router = replicas.routers["kv_aware"]
    for i in range(1, 4):
        assert complete(router, PREFIX_A + f"user {i}") == 200 and complete(router, PREFIX_B + f"user {i}") == 200
    (m0, g0), (m1, g1) = counts(r0), counts(r1)
    assert (m0 - n0, m1 - n1) == (4, 4), "each prefix's requests land on the replica holding it"
    shared = (len(PREFIX_A) // 16 - 1) * 16  # full blocks of the shared prefix, BOS included, at least
    assert g1 - h1 >= 3 * shared and g0 - h0 >= 3 * shared, (g0 - h0, g1 - h1)


def landed_on(replicas, send) -> int:
    """Which replica's finished-request count rose while send() ran (exactly one must)."""
    before = [counts(r)[0] for r in replicas]
    assert send() == 200
    rose = [i for i, (r, n) in enumerate(zip(replicas, before)) if counts(r)[0] > n]
    assert len(rose) == 1, rose
    return rose[0]


def test_sglang_cache_aware_keeps_each_prefix_on_one_replica(replicas):
    """SGLang's router follows the request texts it routed (no events): a prefix sticks where it first went."""
    router, reps = replicas.routers["sglang:cache_aware"], replicas.replicas
    prefixes = [PREFIX_A.replace("rivers", "lakes"), PREFIX_B.replace("poems", "songs")]
    homes = [landed_on(reps, lambda p=p: complete(router, p + "user 0")) for p in prefixes]
    for i in range(1, 3):
        for p, home in zip(prefixes, homes):
            assert landed_on(reps, lambda p=p: complete(router, p + f"user {i}")) == home


@pytest.mark.slow
def test_a_killed_replica_is_routed_around_and_rejoins_after_a_restart(replicas):
    r0, r1 = replicas.replicas
    router = replicas.routers["round_robin"]
    with ThreadPoolExecutor(16) as pool:
        before = [pool.submit(complete, router, f"request {i}: " + "tell me a long story. " * 3, 160) for i in range(8)]
        deadline = time.monotonic() + 20
        while (busy := r1.metrics().get("vllm:num_requests_running", 0.0)) < 1:
            assert time.monotonic() < deadline, "the router sent nothing to the second replica"
            time.sleep(0.02)
        started = busy + r1.metrics().get("vllm:num_requests_waiting", 0.0)
        r1.kill()
        after = [pool.submit(complete, router, f"after {i}: a short one", 8) for i in range(8)]
        first, second = [f.result() for f in before], [f.result() for f in after]
    assert all(s == 200 for s in second), f"requests sent after the kill: {second}"
    assert sum(s != 200 for s in first) <= started, f"only requests running on the killed replica may fail: {first}"
    r1.start()
    r1.wait_healthy(60)
    deadline = time.monotonic() + 60
    while counts(r1)[0] == 0:  # the restarted replica's counters start from zero
        assert time.monotonic() < deadline, "the restarted replica got no traffic"
        assert complete(router, "back again?") == 200
