"""Shared-prefix traffic through vLLM's router over two replicas: cache-aware vs round-robin, and what
the router itself adds.

    python profiling/benchmarks/bench_router.py [--model PATH] [--systems 3] [--users 6] [--concurrency 2]

Starts two one-thread replicas of `python -m runtime.serve` (KV events on) and vllm-router twice over
them: kv_aware (fed by the replicas' KV events) and round_robin. The workload is several system
prompts, many users each, shuffled; each policy gets its own system prompts, so neither inherits the
other's cache. Per policy: the prefix-cache hit rate summed over both replicas (hit tokens over queried
tokens, from their /metrics) and TTFT P50 at the client, streamed. Then the router's added latency:
the same one-token requests, unique prompts, one at a time, alternately straight to a replica and via
each router (E2E P50 difference). Only 127.0.0.1 is used. Writes profiling/out/bench_router.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import httpx  # noqa: E402

from profiling.benchmarks.bench_serving import WORDS, BenchRequest, RequestResult, one_request  # noqa: E402
from profiling.common.router_fleet import Fleet, fleet  # noqa: E402
from profiling.common.workloads import percentile  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICIES = ("kv_aware", "round_robin")
MODEL_NAME = "model"


def shared_prefix_workload(tag: str, systems: int, users: int, system_words: int, seed: int) -> list[BenchRequest]:
    rng = random.Random(f"{seed}-{tag}")
    prompts = [f"[{tag} system {s}] " + " ".join(rng.choice(WORDS) for _ in range(system_words)) for s in range(systems)]
    reqs = [BenchRequest(f"{p}\nuser {u}: " + " ".join(rng.choice(WORDS) for _ in range(12)), 8)
            for p in prompts for u in range(users)]
    rng.shuffle(reqs)
    return reqs


async def run_all(url: str, reqs: list[BenchRequest], concurrency: int) -> list[RequestResult]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(req: BenchRequest) -> RequestResult:
            async with gate:
                return await one_request(client, url, MODEL_NAME, req, ignore_eos=True)
        return await asyncio.gather(*(one(r) for r in reqs))


def cache_counters(f: Fleet) -> tuple[float, float, list[float]]:
    """Hit and queried prompt tokens summed over the replicas, and each one's finished requests."""
    ms = [r.metrics() for r in f.replicas]
    return (sum(m.get("vllm:prefix_cache_hits_total", 0.0) for m in ms),
            sum(m.get("vllm:prefix_cache_queries_total", 0.0) for m in ms),
            [m.get("vllm:request_success_total", 0.0) for m in ms])


def policy_phase(f: Fleet, policy: str, reqs: list[BenchRequest], concurrency: int) -> dict:
    hits0, queries0, done0 = cache_counters(f)
    start = time.perf_counter()
    results = asyncio.run(run_all(f.routers[policy], reqs, concurrency))
    wall = time.perf_counter() - start
    hits1, queries1, done1 = cache_counters(f)
    ok = [r for r in results if r.ok]
    return {"policy": policy, "requests": len(reqs), "failed": len(reqs) - len(ok), "wall_s": wall,
            "per_replica": [b - a for a, b in zip(done0, done1)],
            "prefix_hit_rate": (hits1 - hits0) / max(queries1 - queries0, 1),
            "ttft_p50_s": percentile([r.ttft for r in ok], 50), "e2e_p50_s": percentile([r.e2e for r in ok], 50)}


def added_latency(f: Fleet, n: int, seed: int) -> dict:
    """E2E P50 of one-token requests with unique prompts, one at a time, direct vs via each router."""
    rng = random.Random(seed)
    routes = {"direct": f.replicas[0].url, **f.routers}
    e2e: dict[str, list[float]] = {k: [] for k in routes}
    for i in range(n):
        for name, url in routes.items():  # interleaved, so drifting load falls on every route alike
            req = BenchRequest(f"[{name} {i}] " + " ".join(rng.choice(WORDS) for _ in range(24)), 1)
            (res,) = asyncio.run(run_all(url, [req], 1))
            if res.ok:
                e2e[name].append(res.e2e)
    p50 = {name: percentile(v, 50) for name, v in e2e.items()}
    return {"requests_per_route": n, "e2e_p50_s": p50,
            "added_ms": {p: (p50[p] - p50["direct"]) * 1000 for p in f.routers}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a .gguf or HF folder (default: the default model)")
    p.add_argument("--systems", type=int, default=8, help="system prompts (default: 8)")
    p.add_argument("--users", type=int, default=4, help="users per system prompt (default: 4)")
    p.add_argument("--system-words", type=int, default=160, help="words per system prompt (default: 160)")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight (default: 2)")
    p.add_argument("--kv-cache-memory", default="64MiB",
                   help="each replica's KV pool (default: 64MiB, ~1,400 tokens of the default model: a few "
                        "system prompts, so where a prefix is sent decides whether it stays cached)")
    p.add_argument("--latency-requests", type=int, default=12, help="requests per route for the added latency")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(REPO, "profiling", "out", "bench_router.json"))
    args = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    with fleet(args.model, POLICIES, model_name=MODEL_NAME, timeout=300,
               extra=("--shutdown-grace", "0", "--kv-cache-memory", args.kv_cache_memory)) as f:
        phases = [policy_phase(f, policy, shared_prefix_workload(policy, args.systems, args.users,
                                                                 args.system_words, args.seed), args.concurrency)
                  for policy in POLICIES]
        latency = added_latency(f, args.latency_requests, args.seed)
    report = {"model": args.model or "default", "systems": args.systems, "users": args.users,
              "concurrency": args.concurrency, "phases": phases, "router_latency": latency,
              "load_average": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count()}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
    print(f"{'policy':<12} {'requests':>8} {'per replica':>11} {'failed':>6} {'prefix hit rate':>15} "
          f"{'TTFT p50':>9} {'E2E p50':>8}")
    for ph in phases:
        split = "/".join(f"{n:.0f}" for n in ph["per_replica"])
        print(f"{ph['policy']:<12} {ph['requests']:>8} {split:>11} {ph['failed']:>6} {ph['prefix_hit_rate']:>15.1%} "
              f"{ph['ttft_p50_s'] * 1000:>7.0f}ms {ph['e2e_p50_s'] * 1000:>6.0f}ms")
    kv, rr = phases
    print(f"cache-aware / round-robin TTFT p50: {kv['ttft_p50_s'] / rr['ttft_p50_s']:.2f}x")
    print("router's added latency (E2E p50, one-token requests one at a time): "
          + ", ".join(f"{k} {v:+.1f} ms" for k, v in latency["added_ms"].items())
          + f" over {latency['e2e_p50_s']['direct'] * 1000:.0f} ms direct")
    print(f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
