"""Prefill/decode disaggregation against colocation: steady chat traffic plus a flood of long prompts.

    python profiling/benchmarks/bench_pd.py --duration 40

disaggregated: a `--kv-role prefill` and a `--kv-role decode` instance, one core and one thread each
(taskset), behind vllm-router's vLLM prefill/decode mode. colocated: one instance with both roles on two
cores and two threads, chunked prefill (--max-num-batched-tokens). Both runs get the same arrivals:
chat requests (short prompt, --chat-tokens out, streamed) at --chat-rate per second and long prompts
(--long-words words, --long-tokens out) at --long-rate per second. Reported per run: the chat requests'
inter-token latency p50/p99/max, TTFT p50/p99 of both kinds, output tokens per second, and (disaggregated)
the KV transfer time per request from the decode instance's vllm:nixl_xfer_time_seconds. The router, the
load generator and anything else on the machine share the cores: say the load average with any figure.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import httpx  # noqa: E402

from profiling.benchmarks.bench_serving import (  # noqa: E402
    WORDS,
    BenchRequest,
    RequestResult,
    one_request,
    start_server,
    stop_server,
)
from profiling.benchmarks.pd_router import vllm_pd_router  # noqa: E402


def arrivals(rate: float, duration: float, rng: random.Random) -> list[float]:
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def workload(args) -> list[tuple[float, str, BenchRequest]]:
    """(arrival second, kind, request), in arrival order; the same for every run (seeded)."""
    rng = random.Random(args.seed)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    chat = [(t, "chat", BenchRequest(words(args.chat_words), args.chat_tokens))
            for t in arrivals(args.chat_rate, args.duration, rng)]
    long = [(t, "long", BenchRequest(words(args.long_words), args.long_tokens))
            for t in arrivals(args.long_rate, args.duration, rng)]
    return sorted(chat + long, key=lambda x: x[0])


async def drive(url: str, model: str, items: list[tuple[float, str, BenchRequest]]
                ) -> tuple[list[tuple[str, RequestResult]], float]:
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10),
                                 limits=httpx.Limits(max_connections=len(items))) as client:
        start = loop.time()

        async def issue(at: float, kind: str, req: BenchRequest) -> tuple[str, RequestResult]:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            return kind, await one_request(client, url, model, req, ignore_eos=True)

        results = await asyncio.gather(*(issue(*item) for item in items))
        return results, loop.time() - start


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def summary(results: list[tuple[str, RequestResult]], seconds: float) -> dict:
    ok = [(k, r) for k, r in results if r.ok]
    chat_itl = [gap for k, r in ok if k == "chat" for gap in r.itl]
    out = {"requests": len(results), "failed": len(results) - len(ok), "seconds": round(seconds, 1),
           "output_tokens_per_s": round(sum(r.output_tokens for _, r in ok) / seconds, 1),
           "chat_itl_ms": {q: _ms(pct(chat_itl, p)) for q, p in (("p50", 50), ("p99", 99))} | {"max": _ms(max(chat_itl, default=None))}}
    for kind in ("chat", "long"):
        ttft = [r.ttft for k, r in ok if k == kind]
        out[f"{kind}_ttft_ms"] = {"p50": _ms(pct(ttft, 50)), "p99": _ms(pct(ttft, 99)), "n": len(ttft)}
    errors = sorted({r.error for _, r in results if not r.ok})
    if errors:
        out["errors"] = errors[:3]
    return out


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def settle(url: str, timeout: float = 180.0) -> None:
    """Until the chat page has loaded (its import runs on the server's cores right after start)."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/health", timeout=10).json().get("chat_page") == "loading" and time.monotonic() < deadline:
        time.sleep(0.5)


def warm(url: str, model: str) -> None:
    """One request of each kind first: the first of anything pays one-time costs (not what is measured)."""
    for words in (20, 400):
        httpx.post(url + "/v1/completions", timeout=300, json={"model": model, "prompt": " ".join(WORDS[:1] * words),
                                                                "max_tokens": 4, "ignore_eos": True, "stream": True})


def served_model(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def metric_sum(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


@contextlib.contextmanager
def instance(args, log: str, cpus: str, threads: int, *extra: str) -> Iterator[str]:
    serve = ["--host", "127.0.0.1", "--log-level", "warning", "--kv-cache-memory", args.kv_cache_memory,
             *(["--model", args.model] if args.model else []), *extra]
    proc, url = start_server(serve, open(log, "w"), 600, ["taskset", "-c", cpus], {"OMP_NUM_THREADS": str(threads)})
    try:
        settle(url)
        yield url
    finally:
        stop_server(proc)


def run_disaggregated(args, items, logs: str) -> dict:
    with instance(args, f"{logs}/prefill.log", "0", 1, "--kv-role", "prefill") as prefill, \
            instance(args, f"{logs}/decode.log", "1", 1, "--kv-role", "decode") as decode, \
            vllm_pd_router(prefill, decode) as router:
        warm(router, model := served_model(decode))
        results, seconds = asyncio.run(drive(router, model, items))
        out = summary(results, seconds)
        n = metric_sum(decode, "vllm:nixl_xfer_time_seconds_count")
        out["transfer_ms_per_request"] = _ms(metric_sum(decode, "vllm:nixl_xfer_time_seconds_sum") / n) if n else None
        out["transfer_bytes_per_request"] = round(metric_sum(decode, "vllm:nixl_bytes_transferred_sum") / n) if n else None
        out["failed_transfers"] = metric_sum(decode, "vllm:nixl_num_failed_transfers_total")
        return out


def run_colocated(args, items, logs: str) -> dict:
    with instance(args, f"{logs}/colocated.log", "0,1", 2, "--max-num-batched-tokens",
                  str(args.chunk_tokens)) as url:
        warm(url, model := served_model(url))
        results, seconds = asyncio.run(drive(url, model, items))
        return summary(results, seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the default model (SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals per run")
    p.add_argument("--chat-rate", type=float, default=1.0)
    p.add_argument("--chat-words", type=int, default=30)
    p.add_argument("--chat-tokens", type=int, default=48)
    p.add_argument("--long-rate", type=float, default=1.0)  # a flood: one 700-word prompt a second
    p.add_argument("--long-words", type=int, default=700)
    p.add_argument("--long-tokens", type=int, default=4)
    p.add_argument("--chunk-tokens", type=int, default=256, help="colocated: --max-num-batched-tokens")
    p.add_argument("--kv-cache-memory", default="512MiB")
    p.add_argument("--runs", default="disaggregated,colocated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    items = workload(args)
    runs = {"disaggregated": run_disaggregated, "colocated": run_colocated}
    report = {"load_average_before": os.getloadavg(), "settings": vars(args)}
    with tempfile.TemporaryDirectory() as logs:
        for name in args.runs.split(","):
            report[name] = runs[name](args, items, logs)
            print(name, json.dumps(report[name]), flush=True)
    report["load_average_after"] = os.getloadavg()
    d, c = report.get("disaggregated"), report.get("colocated")
    if d and c and d["chat_itl_ms"]["p99"] and c["chat_itl_ms"]["p99"]:
        report["chat_itl_p99_colocated_over_disaggregated"] = round(c["chat_itl_ms"]["p99"] / d["chat_itl_ms"]["p99"], 2)
    print(json.dumps({k: report[k] for k in report if k not in ("disaggregated", "colocated")}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
