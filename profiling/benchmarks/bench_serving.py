"""Serving load test over real HTTP streaming: TTFT, TPOT, ITL, E2E (P50/P95/P99), throughput, goodput.

    python profiling/benchmarks/bench_serving.py --url http://127.0.0.1:8000 --num-requests 64 --rate 4
    python profiling/benchmarks/bench_serving.py --launch --server-args "--kv-cache-memory 256MiB" --concurrency 8
    python profiling/benchmarks/bench_serving.py --launch --num-requests 48 --prompt-words 256 --output-tokens 128 \
        --vllm-python VENV/bin/python --vllm-dtypes bfloat16   # then the same load on `vllm serve`, ours / its ratios

Requests arrive as a Poisson process at --rate per second, or with a fixed --concurrency (both: a
Poisson process capped at that concurrency). Prompts come from a synthetic workload (random words,
fixed output lengths via ignore_eos) or a file (JSONL {"prompt", "max_tokens"} or one prompt per
line). Goodput counts requests per second that meet both --slo-ttft and --slo-tpot. Definitions
as in shared/DESIGN.md: TTFT from sending to the first streamed text (the first chunk with choices,
which is how vllm bench serve times it: neither route sends one before the first token), TPOT = (E2E - TTFT) / (output
tokens - 1), ITL = each gap between streamed text chunks. Writes JSON and a PNG of the distributions.
Only 127.0.0.1 is ever targeted; --launch starts `python -m runtime.serve` there and stops it after.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import IO
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import httpx  # noqa: E402

from profiling.common.executable_arg import executable  # noqa: E402
from profiling.common.server_settle import wait_settled  # noqa: E402
from profiling.common.serving_plot import plot  # noqa: E402
from profiling.common.vllm_peer import served_ratios  # noqa: E402
from profiling.common.workloads import summarize  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_REQUESTS = 100_000
WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain music garden kernel token cache memory").split()


class BenchError(Exception):
    """A one-line reason to stop (bad flags, a host that is not 127.0.0.1, a server that never came up)."""


@dataclass
class BenchRequest:
    prompt: str
    max_tokens: int


@dataclass
class RequestResult:
    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def synthetic_workload(n: int, prompt_words: tuple[int, int], output_tokens: tuple[int, int],
                       seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    return [BenchRequest(" ".join(rng.choice(WORDS) for _ in range(rng.randint(*prompt_words))),
                         rng.randint(*output_tokens)) for _ in range(n)]


def file_workload(path: str, n: int, output_tokens: tuple[int, int], seed: int) -> list[BenchRequest]:
    rng = random.Random(seed)
    items = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                obj = json.loads(line)
                items.append(BenchRequest(obj["prompt"], int(obj.get("max_tokens") or rng.randint(*output_tokens))))
            else:
                items.append(BenchRequest(line, rng.randint(*output_tokens)))
    if not items:
        raise BenchError(f"no prompts in {path}")
    return [items[i % len(items)] for i in range(n)]


def check_local(url: str) -> str:
    host = urlparse(url).hostname
    if host != "127.0.0.1":
        raise BenchError(f"refusing to load {host or url!r}: this benchmark only targets 127.0.0.1")
    return url.rstrip("/")


async def one_request(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest,
                      ignore_eos: bool) -> RequestResult:
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    start = time.perf_counter()
    res = RequestResult(ok=False)
    last = None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200].decode(errors='replace')}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    res.error = chunk["error"].get("message", "error event")
                    return res
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2e = time.perf_counter() - start
        res.ok = res.ttft is not None
        res.error = None if res.ok else "no text streamed"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_load(url: str, model: str, workload: list[BenchRequest], rate: float | None,
                   concurrency: int | None, max_duration: float, ignore_eos: bool, headers: dict[str, str],
                   seed: int) -> tuple[list[RequestResult], float]:
    rng = random.Random(seed + 1)
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    limits = httpx.Limits(max_connections=concurrency or len(workload), max_keepalive_connections=64)
    results: list[RequestResult | None] = [None] * len(workload)

    async with httpx.AsyncClient(timeout=httpx.Timeout(max_duration, connect=10), limits=limits,
                                 headers=headers) as client:
        async def issue(i: int) -> None:
            async with gate or contextlib.nullcontext():
                results[i] = await one_request(client, url, model, workload[i], ignore_eos)

        start = time.perf_counter()
        deadline = start + max_duration
        tasks = []
        for i in range(len(workload)):
            if time.perf_counter() >= deadline:
                break
            tasks.append(asyncio.create_task(issue(i)))
            if rate:
                await asyncio.sleep(min(rng.expovariate(rate), max(0.0, deadline - time.perf_counter())))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - start
    out = [r if r is not None else RequestResult(ok=False, error="not finished within --max-duration")
           for r in results[:len(tasks)]]
    return out, duration


def report(results: list[RequestResult], duration: float, slo_ttft: float, slo_tpot: float) -> dict:
    ok = [r for r in results if r.ok]
    good = [r for r in ok if r.ttft <= slo_ttft and (r.tpot is None or r.tpot <= slo_tpot)]
    out_tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_token_throughput": out_tokens / duration if duration else 0.0,
        "goodput": len(good) / duration if duration else 0.0, "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot},
        **{key: summarize(values) for key, values in latency_samples(ok).items()},
        "output_tokens": out_tokens, "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:10]),
    }


def latency_samples(ok: list[RequestResult]) -> dict[str, list[float]]:
    """Seconds, by summary key: per-request TTFT, TPOT and E2E, and every inter-token gap."""
    return {"ttft_s": [r.ttft for r in ok], "tpot_s": [r.tpot for r in ok if r.tpot is not None],
            "itl_s": [g for r in ok for g in r.itl], "e2e_s": [r.e2e for r in ok]}


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(serve_args: list[str], log: IO[str], timeout: float, prefix: list[str] | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m runtime.serve --port <free> SERVE_ARGS`, output to `log`; (process, base URL) once
    /health answers. Raises BenchError (and stops the process) if it exits or does not come up.
    prefix: a command it runs under (["taskset", "-c", "0"]); env: variables added to ours."""
    port = free_port()  # the child binds it; a race with another process is possible but unlikely
    cmd = [*(prefix or []), sys.executable, "-m", "runtime.serve", "--port", str(port), *serve_args]
    return start_process(cmd, port, log, timeout, {**os.environ, **(env or {})})


def start_process(cmd: list[str], port: int, log: IO[str], timeout: float,
                  env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """A server started by cmd on 127.0.0.1:port: (process, base URL) once its /health answers, as start_server."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.25)
    stop_server(proc)
    raise BenchError(f"the server did not come up within {timeout:.0f} s")


def launch_server(model: str | None, server_args: str, log_path: str, timeout: float) -> tuple[subprocess.Popen, str]:
    serve_args = ["--host", "127.0.0.1", "--log-level", "warning"]
    serve_args += (["--model", model] if model else []) + shlex.split(server_args)
    try:
        return start_server(serve_args, open(log_path, "w"), timeout)
    except BenchError as exc:
        raise BenchError(f"{exc}; see {log_path}") from None


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    a, b = int(lo), int(hi or lo)
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected N or LO:HI with 1 <= LO <= HI, got {text!r}")
    return a, b


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_serving.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server to load (127.0.0.1 only)")
    p.add_argument("--launch", action="store_true", help="start python -m runtime.serve for this run")
    p.add_argument("--model", default=None, help="with --launch: the model (default: the default model)")
    p.add_argument("--server-args", default="", help="with --launch: more server flags, one string")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="seconds to wait for the server to load")
    p.add_argument("--api-key", default=None, help="send 'Authorization: Bearer KEY'")
    p.add_argument("--num-requests", type=int, default=64, help=f"requests to send (at most {MAX_REQUESTS})")
    p.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second (default: all at once)")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight")
    p.add_argument("--workload", default="synthetic", help="'synthetic', or a .jsonl / text file of prompts")
    p.add_argument("--prompt-words", type=_range, default=(32, 256), help="synthetic prompt words, LO:HI")
    p.add_argument("--output-tokens", type=_range, default=(16, 128), help="tokens to generate, LO:HI")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let requests stop at EOS (default: generate exactly the asked tokens)")
    p.add_argument("--slo-ttft", type=float, default=0.5, help="TTFT SLO for goodput, seconds (default 0.5)")
    p.add_argument("--slo-tpot", type=float, default=0.05, help="TPOT SLO for goodput, seconds (default 0.05)")
    p.add_argument("--max-duration", type=float, default=600.0, help="hard limit on the run, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-python", type=executable, default=None, help="with --launch: also serve the same weights by `vllm serve` "
                   "from this Python (vLLM's CPU build), once per --vllm-dtypes, under the same load")
    p.add_argument("--vllm-dtypes", default="float32,bfloat16", help="vLLM's dtypes (bfloat16: its CPU default)")
    p.add_argument("--out", default=os.path.join(REPO, "profiling", "out", "bench_serving"),
                   help="output path prefix: writes PREFIX.json and PREFIX.png")
    args = p.parse_args(argv)
    if not 1 <= args.num_requests <= MAX_REQUESTS:
        p.error(f"--num-requests must be in [1, {MAX_REQUESTS}]")
    if args.rate is not None and args.rate <= 0:
        p.error("--rate must be > 0")
    if args.concurrency is not None and args.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if not 0 < args.max_duration <= 24 * 3600:
        p.error("--max-duration must be in (0, 86400]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        url = None if args.launch else check_local(args.url)
        if args.workload == "synthetic":
            workload = synthetic_workload(args.num_requests, args.prompt_words, args.output_tokens, args.seed)
        else:
            workload = file_workload(args.workload, args.num_requests, args.output_tokens, args.seed)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        proc = None
        if args.launch:
            proc, url = launch_server(args.model, args.server_args, args.out + ".server.log", args.launch_timeout)
            print(f"server settled after {wait_settled(proc.pid, url, args.launch_timeout):.1f} s", flush=True)
        try:
            headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
            model = httpx.get(url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
            results, duration = asyncio.run(run_load(url, model, workload, args.rate, args.concurrency,
                                                     args.max_duration, args.ignore_eos, headers, args.seed))
        finally:
            if proc is not None:
                stop_server(proc)
    except (BenchError, OSError, httpx.HTTPError, KeyError, ValueError) as exc:
        print(f"bench_serving: error: {exc}", file=sys.stderr)
        return 2
    summary = report(results, duration, args.slo_ttft, args.slo_tpot)
    summary.update(url=url, model=model, rate=args.rate, concurrency=args.concurrency, workload=args.workload)
    write_results(args.out, summary, results)
    plot(latency_samples([r for r in results if r.ok]), summary, args.out + ".png")
    print_summary(summary, args.out)
    for dtype in filter(None, args.vllm_dtypes.split(",") if args.launch and args.vllm_python else []):
        try:
            peer = serve_vllm(args, workload, dtype)
        except (BenchError, OSError, httpx.HTTPError) as exc:
            print(f"bench_serving: vLLM {dtype}: {exc}", file=sys.stderr)
            return 2
        print_summary(peer, args.out + f".vllm-{dtype}")
        print(served_ratios(summary, peer))
    return 0 if summary["completed"] else 1


def write_results(prefix: str, summary: dict, results: list[RequestResult]) -> None:
    with open(prefix + ".json", "w") as f:
        json.dump(_json_safe({"summary": summary, "requests": [asdict(r) for r in results]}), f, indent=1)


def serve_vllm(args: argparse.Namespace, workload: list[BenchRequest], dtype: str) -> dict:
    """The same load against `vllm serve` of the same weights (exported as an HF folder) in dtype."""
    from profiling.common.vllm_peer import vllm_server
    from weights.default import resolve_model_path

    log = args.out + f".vllm-{dtype}"
    with vllm_server(args.vllm_python, resolve_model_path(args.model), dtype, free_port(), log + ".log",
                     args.launch_timeout, start_process, stop_server) as (url, name, engine):
        results, duration = asyncio.run(run_load(url, name, workload, args.rate, args.concurrency, args.max_duration,
                                                 args.ignore_eos, {}, args.seed))
    summary = report(results, duration, args.slo_ttft, args.slo_tpot)
    summary.update(engine=engine, rate=args.rate)
    write_results(log, summary, results)
    return summary


def print_summary(s: dict, out: str) -> None:
    print(f"{s.get('engine', 'ours')}: {s['completed']}/{s['requests']} requests ok in {s['duration_s']:.1f} s: "
          f"{s['request_throughput']:.2f} req/s, {s['output_token_throughput']:.1f} output tok/s, goodput {s['goodput']:.2f} req/s "
          f"(TTFT <= {s['slo']['ttft_s']} s and TPOT <= {s['slo']['tpot_s']} s)")
    for name in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        v = s[name]
        print(f"  {name[:-2].upper():5s} p50 {v['p50'] * 1000:9.1f} ms   p95 {v['p95'] * 1000:9.1f} ms   "
              f"p99 {v['p99'] * 1000:9.1f} ms")
    if s["errors"]:
        print(f"  errors: {s['errors']}")
    print(f"wrote {out}.json" + (f" and {out}.png" if os.path.exists(out + ".png") else ""))


if __name__ == "__main__":
    sys.exit(main())
