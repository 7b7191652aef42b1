"""bench_structured.py --adversarial: plain requests' TTFT and TPOT on an idle server, then again while
hostile clients keep sending the grammars and schemas that once stalled or exhausted it (issue 38):
a 27-byte ambiguous grammar whose masks blow up, a 20,000- and a 100,000-string enum, a 1.3 MB
schema, 256 choices of 2 KB, a 50-byte schema that compiles for ~30 s, unenforced keywords.
Each hostile request differs from the last of its kind (a fresh rule name, alphabet or prefix), so
no cache helps. Idle and hostile runs alternate for --rounds rounds, so the machine's own noise
shows as the spread between rounds; the server is `python -m runtime.serve`.

The hostile clients run in a process of their own, their bodies serialized before the measured
runs: building a 3 MB body in the measuring process's event loop held up its clock (~75 ms a body,
more on a busy machine) and was counted as the server's TTFT. An attacker's CPU is not the server's."""
from __future__ import annotations

import asyncio
import collections
import itertools
import json
import multiprocessing
import os
import string
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx

from profiling.benchmarks.bench_serving import RequestResult, run_load, start_server, stop_server, synthetic_workload
from profiling.common.workloads import summarize

VARIANTS = 4  # bodies built per large kind (each sent in turn): cheap kinds are built fresh each time


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
LARGE = ("20k-string enum", "100k-string enum", "1.3 MB schema", "256 x 2 KB choices")


class Bodies:
    """Each kind's next request body as bytes; the large ones built once (VARIANTS of each)."""

    def __init__(self, model: str, kinds: list[str]) -> None:
        self.model, self.kinds = model, kinds
        self.large = {k: [self._body(k, v) for v in range(VARIANTS)] for k in kinds if k in LARGE}

    def _body(self, kind: str, i: int) -> bytes:
        body = {"model": self.model, "prompt": "Write something.", "max_tokens": 16, **HOSTILE[kind](i)}
        return json.dumps(body).encode()

    def get(self, i: int) -> tuple[str, bytes]:
        kind = self.kinds[i % len(self.kinds)]
        return kind, self.large[kind][i // len(self.kinds) % VARIANTS] if kind in self.large else self._body(kind, i)


async def hostile_client(url: str, bodies: Bodies, start: int, stop: Any, tally: collections.Counter,
                         parent: int) -> None:
    """Send the hostile requests in turn until stop is set or the bench that started them is gone (a killed
    bench would otherwise leave them hammering a dead port at most of a core); tally (kind, status, code)."""
    async with httpx.AsyncClient(timeout=120) as client:
        for i in itertools.count(start):
            if stop.is_set() or os.getppid() != parent:
                return
            kind, body = bodies.get(i)
            try:
                r = await client.post(url + "/v1/completions", content=body,
                                      headers={"content-type": "application/json"})
                tally[(kind, r.status_code, (r.json().get("error") or {}).get("code") if r.status_code != 200
                       else "ok")] += 1
            except (httpx.HTTPError, ValueError) as exc:
                tally[(kind, type(exc).__name__, None)] += 1


def _attack(url: str, model: str, kinds: list[str], clients: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """The hostile process: build the bodies, say ready; from go to stop attack; put the tally on out."""
    bodies, parent = Bodies(model, kinds), os.getppid()
    ready.set()
    go.wait()

    async def attack() -> collections.Counter:
        tally: collections.Counter = collections.Counter()
        await asyncio.gather(*(hostile_client(url, bodies, k * 3, stop, tally, parent) for k in range(clients)))
        return tally

    out.put(dict(asyncio.run(attack())))


class Attackers:
    """The hostile clients' process, started (bodies built) before the runs it joins."""

    def __init__(self, url: str, model: str, kinds: list[str], clients: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.go, self.stop, self.out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_attack, args=(url, model, kinds, clients, self.ready, self.go, self.stop,
                                                      self.out), daemon=True)
        self.proc.start()
        if not self.ready.wait(300):
            self.proc.kill()
            raise RuntimeError("the hostile clients did not build their bodies within 300 s")

    def start(self) -> None:
        self.go.set()

    def finish(self) -> collections.Counter:
        self.stop.set()
        tally = collections.Counter(self.out.get(timeout=300))  # the last answers: up to a compile's limit
        self.proc.join(10)
        return tally


async def plain_run(url: str, model: str, n: int, concurrency: int, max_tokens: int,
                    seed: int = 0) -> list[RequestResult]:
    workload = synthetic_workload(n, (20, 40), (max_tokens, max_tokens), seed=seed)
    results, _ = await run_load(url, model, workload, None, concurrency, 1800, True, {}, 0)
    return results


def hostile_run(url: str, model: str, n: int, concurrency: int, max_tokens: int, kinds: list[str], clients: int,
                seed: int) -> tuple[list[RequestResult], collections.Counter]:
    attackers = Attackers(url, model, kinds, clients)
    attackers.start()
    time.sleep(2.0)  # the hostile requests are under way before the first plain one
    try:
        results = asyncio.run(plain_run(url, model, n, concurrency, max_tokens, seed))
    finally:
        tally = attackers.finish()
    return results, tally


def _p(results: list[RequestResult], what: str) -> dict[str, float]:
    values = [getattr(r, what) for r in results if r.ok and getattr(r, what) is not None]
    return summarize(values) if values else {"p50": float("nan"), "p99": float("nan")}


def wait_settled(url: str, timeout: float = 300) -> None:
    """Until the server's start-up work is done (the chat page built, the compile workers' warm-up
    compile over) and no compile is left from a hostile run: any of them, still running, would slow
    the idle run and flatter the ratios."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loading = httpx.get(url + "/health").json().get("chat_page") == "loading"
        compiling = next((float(line.split()[1]) for line in httpx.get(url + "/metrics").text.splitlines()
                          if line.startswith("cute_serve:grammar_compiles_running ")), 0.0)
        if not loading and compiling == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the server still starts up after {timeout:.0f} s")


@dataclass
class Phase:
    label: str
    results: list[RequestResult]
    load: float  # the 1-minute load average at its end
    seconds: float
    tally: collections.Counter = field(default_factory=collections.Counter)


def line(label: str, results: list[RequestResult], n: int, extra: str = "") -> str:
    ttft, tpot = _p(results, "ttft"), _p(results, "tpot")
    return (f"  {label:24s} ok {sum(r.ok for r in results):4d}/{n:<4d} TTFT p50 {ttft['p50'] * 1e3:7.1f} p99 "
            f"{ttft['p99'] * 1e3:7.1f} ms   TPOT p50 {tpot['p50'] * 1e3:6.1f} p99 {tpot['p99'] * 1e3:6.1f} ms{extra}")


def ratios(idle: list[RequestResult], busy: list[RequestResult]) -> str:
    r = {(w, q): _p(busy, w)[q] / _p(idle, w)[q] for w in ("ttft", "tpot") for q in ("p50", "p99")}
    return (f"hostile/idle TTFT p50 {r['ttft', 'p50']:.2f}x p99 {r['ttft', 'p99']:.2f}x   "
            f"TPOT p50 {r['tpot', 'p50']:.2f}x p99 {r['tpot', 'p99']:.2f}x")


def main(model: str | None, n: int, concurrency: int, max_tokens: int, hostile: int, rounds: int = 1,
         kinds: list[str] | None = None, server_args: list[str] | None = None) -> None:
    """server_args: more flags for the server (e.g. --grammar-compile-cpu-share 1, to see a budget's effect)."""
    kinds = kinds or list(HOSTILE)
    log = tempfile.NamedTemporaryFile("w+", prefix="bench-adversarial-", suffix=".log", delete=False)
    proc, url = start_server(["--log-level", "warning", *(["--model", model] if model else []), *(server_args or [])],
                             log, 300)
    phases: list[Phase] = []
    try:
        name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        asyncio.run(plain_run(url, name, 4, concurrency, 8))  # warm-up: first forwards
        for r in range(rounds):
            wait_settled(url)
            started = time.monotonic()
            idle = asyncio.run(plain_run(url, name, n, concurrency, max_tokens, seed=r))
            phases.append(Phase(f"round {r + 1} idle", idle, os.getloadavg()[0], time.monotonic() - started))
            started = time.monotonic()
            busy, tally = hostile_run(url, name, n, concurrency, max_tokens, kinds, hostile, seed=r)
            phases.append(Phase(f"round {r + 1} hostile", busy, os.getloadavg()[0], time.monotonic() - started, tally))
    finally:
        stop_server(proc)
    report(phases, n, concurrency, max_tokens, hostile, log.name)


def report(phases: list[Phase], n: int, concurrency: int, max_tokens: int, hostile: int, log_name: str) -> None:
    print(f"{n} plain requests a run ({max_tokens} tokens, concurrency {concurrency}), idle and beside {hostile} "
          f"hostile clients in turn; server log: {log_name}")
    for idle, busy in zip(phases[::2], phases[1::2]):
        for ph in (idle, busy):
            print(line(ph.label, ph.results, n, f"   load {ph.load:4.1f}"))
        print(f"    {ratios(idle.results, busy.results)}")
    if len(phases) > 2:
        idle = [r for ph in phases[::2] for r in ph.results]
        busy = [r for ph in phases[1::2] for r in ph.results]
        print(line("all idle", idle, len(idle)))
        print(line("all hostile", busy, len(busy)))
    else:
        idle, busy = phases[0].results, phases[1].results
    print(f"  {ratios(idle, busy)}  (goal: p99 within 1.5x)")
    tally = sum((ph.tally for ph in phases[1::2]), collections.Counter())
    print(f"  hostile requests answered in {sum(ph.seconds for ph in phases[1::2]):.0f} s of hostile runs:")
    for (kind, status, code), count in sorted(tally.items(), key=str):
        print(f"    {count:4d} x {kind}: {status} {code or ''}")
