"""bench_structured.py --adversarial: plain requests' TTFT and TPOT on an idle server, then again while
hostile clients keep sending the grammars and schemas that once stalled or exhausted it (issue 38):
a 27-byte ambiguous grammar whose masks blow up, a 20,000- and a 100,000-string enum, a 1.3 MB
schema, 256 choices of 2 KB, a 50-byte schema that compiles for ~30 s, unenforceable keywords.
Each hostile request differs from the last (a fresh rule name or alphabet), so no cache helps.
Prints p50/p99 of both runs and the hostile/idle ratios; the server is `python -m runtime.serve`."""
from __future__ import annotations

import asyncio
import collections
import itertools
import string
import tempfile
import time
from typing import Any, Callable

import httpx

from profiling.benchmarks.bench_serving import RequestResult, run_load, start_server, stop_server, synthetic_workload
from profiling.common.workloads import summarize


def _ambiguous(i: int) -> dict[str, Any]:
    e = f"e{i}"  # a new rule name: a new grammar to compile and to mask
    return {"guided_grammar": f'root ::= {e}\n{e} ::= {e} {e} {e} | {e} {e} | [a-z] | ""', "max_tokens": 100,
            "min_tokens": 100}


def _enum(n: int) -> Callable[[int], dict[str, Any]]:
    return lambda i: {"guided_json": {"type": "object", "properties": {"a": {
        "enum": [f"value-{i}-{k:06d}-abcdefghij" for k in range(n)]}}}}


def _slow_compile(i: int) -> dict[str, Any]:
    letters = string.ascii_lowercase[: 10 + i % 16]  # each alphabet a new schema (~30 s to compile)
    return {"guided_json": {"type": "string", "pattern": f"^[{letters}]{{0,20000}}$"}}


HOSTILE: dict[str, Callable[[int], dict[str, Any]]] = {
    "ambiguous grammar": _ambiguous,
    "20k-string enum": _enum(20_000),
    "100k-string enum": _enum(100_000),
    "1.3 MB schema": lambda i: {"guided_json": {"type": "object", "properties": {
        f"p{i}_{k}": {"type": "string"} for k in range(40_000)}}},
    "256 x 2 KB choices": lambda i: {"guided_choice": [f"{i}-{k}-" + "x" * 2040 for k in range(256)]},
    "slow-compiling schema": _slow_compile,
    "unenforced keywords": lambda i: {"guided_json": {"type": "integer", "multipleOf": 3 + i, "not": {"const": 9}}},
}


async def hostile_client(url: str, model: str, start: int, stop: asyncio.Event, tally: collections.Counter) -> None:
    """Send the hostile requests in turn until stop; tally (kind, status) of each answer."""
    async with httpx.AsyncClient(timeout=120) as client:
        for i in itertools.count(start):
            if stop.is_set():
                return
            kind = list(HOSTILE)[i % len(HOSTILE)]
            body = {"model": model, "prompt": "Write something.", "max_tokens": 16, **HOSTILE[kind](i)}
            try:
                r = await client.post(url + "/v1/completions", json=body)
                tally[(kind, r.status_code, (r.json().get("error") or {}).get("code") if r.status_code != 200
                       else "ok")] += 1
            except (httpx.HTTPError, ValueError) as exc:
                tally[(kind, type(exc).__name__, None)] += 1


async def measured_run(url: str, model: str, n: int, concurrency: int, max_tokens: int,
                       hostile: int) -> tuple[list[RequestResult], collections.Counter]:
    workload = synthetic_workload(n, (20, 40), (max_tokens, max_tokens), seed=0)
    stop, tally = asyncio.Event(), collections.Counter()
    attackers = [asyncio.create_task(hostile_client(url, model, k * 3, stop, tally)) for k in range(hostile)]
    if attackers:
        await asyncio.sleep(2.0)  # the hostile requests are under way before the first plain one
    results, _ = await run_load(url, model, workload, None, concurrency, 1800, True, {}, 0)
    stop.set()
    await asyncio.gather(*attackers)
    return results, tally


def _p(results: list[RequestResult], what: str) -> dict[str, float]:
    values = [getattr(r, what) for r in results if r.ok and getattr(r, what) is not None]
    return summarize(values) if values else {"p50": float("nan"), "p99": float("nan")}


def wait_settled(url: str, timeout: float = 300) -> None:
    """Until the server's start-up work is done (the chat page built, the compile workers' warm-up
    compile over): either, still running, would slow the idle run and flatter the ratios."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loading = httpx.get(url + "/health").json().get("chat_page") == "loading"
        compiling = next((float(line.split()[1]) for line in httpx.get(url + "/metrics").text.splitlines()
                          if line.startswith("cute_serve:grammar_compiles_running ")), 0.0)
        if not loading and compiling == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server still starts up after {timeout:.0f} s")


def main(model: str | None, n: int, concurrency: int, max_tokens: int, hostile: int) -> None:
    log = tempfile.NamedTemporaryFile("w+", prefix="bench-adversarial-", suffix=".log", delete=False)
    proc, url = start_server(["--log-level", "warning", *(["--model", model] if model else [])], log, 300)
    try:
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        asyncio.run(measured_run(url, name, 4, concurrency, 8, 0))  # warm-up: first forwards
        wait_settled(url)
        idle, _ = asyncio.run(measured_run(url, name, n, concurrency, max_tokens, 0))
        started = time.monotonic()
        busy, tally = asyncio.run(measured_run(url, name, n, concurrency, max_tokens, hostile))
        elapsed = time.monotonic() - started
    finally:
        stop_server(proc)
    print(f"{n} plain requests ({max_tokens} tokens, concurrency {concurrency}); server log: {log.name}")
    for label, results in (("idle", idle), (f"with {hostile} hostile clients", busy)):
        ttft, tpot = _p(results, "ttft"), _p(results, "tpot")
        print(f"  {label:28s} ok {sum(r.ok for r in results):3d}/{n}  TTFT p50 {ttft['p50'] * 1e3:7.1f} ms  "
              f"p99 {ttft['p99'] * 1e3:7.1f} ms   TPOT p50 {tpot['p50'] * 1e3:6.1f} ms  p99 {tpot['p99'] * 1e3:6.1f} ms")
    ratio = {w: _p(busy, w)["p99"] / _p(idle, w)["p99"] for w in ("ttft", "tpot")}
    print(f"  hostile/idle p99: TTFT {ratio['ttft']:.2f}x  TPOT {ratio['tpot']:.2f}x  (goal: within 1.5x)")
    print(f"  hostile requests answered in {elapsed:.0f} s:")
    for (kind, status, code), count in sorted(tally.items(), key=str):
        print(f"    {count:4d} x {kind}: {status} {code or ''}")
