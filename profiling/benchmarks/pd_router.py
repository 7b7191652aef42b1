"""vllm-router (PyPI's vllm-router, a Rust binary) in its vLLM prefill/decode mode over our instances: started
on a free 127.0.0.1 port, ready once its /health answers (it waits for every worker's), stopped on exit."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from typing import Iterator

import httpx

from profiling.benchmarks.bench_serving import BenchError, free_port


def router_binary() -> str:
    path = os.path.join(sysconfig.get_path("scripts"), "vllm-router")
    found = path if os.path.exists(path) else shutil.which("vllm-router")
    if not found:
        raise BenchError("vllm-router is not installed (pip install vllm-router: the test extra has it)")
    return found


@contextlib.contextmanager
def vllm_pd_router(prefill_url: str, decode_url: str, timeout: float = 60.0) -> Iterator[str]:
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([router_binary(), "--vllm-pd-disaggregation", "--prefill", prefill_url, "--decode",
                             decode_url, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                             "--disable-retries"], stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BenchError(f"vllm-router exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"vllm-router did not come up within {timeout:.0f} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
