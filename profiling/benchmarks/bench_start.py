"""How long `python -m runtime.serve` takes to be ready (GET /health answers 200), warm and fresh,
and until its chat page is mounted (/health says "chat_page": "ready"; it mounts after /health answers).

    python profiling/benchmarks/bench_start.py [--model PATH] [--repeats 3] [--server-args "..."]

warm: the C kernels already built in the cache (~/.cache/cute-serve, or CUTE_SERVE_CACHE), as every
start after the first on a machine; fresh: an empty cache folder, so every C kernel the engine loads
is compiled first, as on a new machine (the pip install itself is not counted). Targets (the CPU
quantized-weights issue): warm <= 5 s, fresh <= 30 s. Beside it, in the same run when llama-cpp-python
imports: llama.cpp's load of the same GGUF (`Llama(model_path=...)`), the peer's time to ready.
Only 127.0.0.1 is used; each server is stopped before the next starts.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from profiling.benchmarks.bench_serving import BenchError, start_server, stop_server  # noqa: E402

TARGETS = {"warm": 5.0, "fresh": 30.0}


def time_to_ready(serve_args: list[str], cache: str | None, log_path: str, timeout: float) -> tuple[float, float]:
    """Seconds from spawning the server to its first 200 on /health, and to its chat page mounted."""
    saved = os.environ.get("CUTE_SERVE_CACHE")
    if cache is not None:
        os.environ["CUTE_SERVE_CACHE"] = cache  # the child inherits it
    try:
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc, url = start_server(serve_args, log, timeout)
        ready = time.perf_counter() - t0
        try:
            page = wait_for_page(url, t0 + timeout) - t0
        finally:
            stop_server(proc)
        return ready, page
    finally:
        if cache is not None and saved is None:
            del os.environ["CUTE_SERVE_CACHE"]
        elif cache is not None:
            os.environ["CUTE_SERVE_CACHE"] = saved


def wait_for_page(url: str, deadline: float) -> float:
    """The perf_counter time at which /health first says the chat page is mounted."""
    while time.perf_counter() < deadline:
        status = httpx.get(url + "/health", timeout=5).json().get("chat_page")
        if status == "ready":
            return time.perf_counter()
        if status != "loading":
            raise BenchError(f"the chat page did not mount: {status}")
        time.sleep(0.05)
    raise BenchError("the chat page did not mount in time")


def llama_cpp_load(model: str | None) -> float | None:
    """Seconds for llama.cpp to load the same GGUF (None when llama-cpp-python does not import)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    if model is None:
        from weights.default import default_model_path

        model = default_model_path()
    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_threads=2, n_ctx=2048, verbose=False)
    seconds = time.perf_counter() - t0
    del llm
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a .gguf file or model folder (default: the default model)")
    ap.add_argument("--repeats", type=int, default=3, help="warm starts to time (the median is reported)")
    ap.add_argument("--server-args", default="", help="more server flags, one string")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one server")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    serve_args = ["--host", "127.0.0.1", "--log-level", "warning", *shlex.split(args.server_args)]
    serve_args += ["--model", args.model] if args.model else []
    log = os.path.join(tempfile.gettempdir(), "bench_start.server.log")
    load_before = os.getloadavg()[0]
    try:
        time_to_ready(serve_args, None, log, args.timeout)  # fills the default cache: later warm starts hit it
        warm = [time_to_ready(serve_args, None, log, args.timeout) for _ in range(args.repeats)]
        with tempfile.TemporaryDirectory() as empty:
            fresh = time_to_ready(serve_args, empty, log, args.timeout)
    except BenchError as exc:
        print(f"error: {exc}; see {log}", file=sys.stderr)
        return 1
    rows = {"warm": statistics.median(s for s, _ in warm), "fresh": fresh[0]}
    print(f"python -m runtime.serve until /health is 200 ({os.cpu_count()} CPUs, load average {load_before:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after); warm: median of {args.repeats} "
          f"({', '.join(f'{s:.2f}' for s, _ in warm)} s)")
    for label, seconds in rows.items():
        verdict = "met" if seconds <= TARGETS[label] else "MISSED"
        print(f"  {label:<6}{seconds:8.2f} s   target <= {TARGETS[label]:.0f} s: {verdict}")
    print(f"  chat page mounted: warm {statistics.median(p for _, p in warm):.2f} s, fresh {fresh[1]:.2f} s "
          f"(after /health answers: the API does not wait for it)")
    peer = llama_cpp_load(args.model)
    if peer is None:
        print("  llama.cpp: llama-cpp-python not importable")
    else:
        print(f"  llama.cpp load {peer:.2f} s; ours warm / llama.cpp: {rows['warm'] / peer:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
