"""Replicas of `python -m runtime.serve` behind vLLM's router (vllm-router from PyPI), all on 127.0.0.1.

Each replica runs on one thread with the API only and publishes its prefix cache as vLLM's KV events
on a ZMQ port of its own; the router's kv_aware policy subscribes to them (--kv-event-source), so it
sends a request where its prefix's KV already is. Used by the router tests and profiling/benchmarks/bench_router.py.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

from profiling.benchmarks.bench_serving import BenchError, free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def replica_command(model: str | None, port: int, events_port: int, *extra: str) -> list[str]:
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events_port}"}
    return [sys.executable, "-m", "runtime.serve", "--port", str(port), "--no-chat-page", "--log-level", "warning",
            "--kv-events-config", json.dumps(events), *(["--model", model] if model else []), *extra]


@dataclass
class Replica:
    """One server process; start() again after kill() brings it back on the same ports."""

    command: list[str]
    port: int
    events_port: int
    log: IO[str]
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one core each
        self.proc = subprocess.Popen(self.command, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_healthy(self, timeout: float) -> None:
        wait_for(self.url + "/health", timeout, self.proc)

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye, as a crashed machine."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def metrics(self) -> dict[str, float]:
        """vLLM's counters and gauges here, by sample name, summed over labels."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(httpx.get(self.url + "/metrics", timeout=5).text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out


def wait_for(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Until GET url answers 200; BenchError when proc exits first or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"{proc.args[0]} exited with {proc.returncode} before {url} answered")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise BenchError(f"{url} did not answer within {timeout:.0f} s")


def router_command(replicas: list[Replica], policy: str, port: int, model_name: str) -> list[str]:
    """vllm-router with a policy of its ("kv_aware", "round_robin", ...), or SGLang's router with
    "sglang:POLICY" ("sglang:cache_aware": its approximate tree of the request texts it routed)."""
    kind, _, policy = policy.rpartition(":")
    package = "sglang_router" if kind == "sglang" else "vllm_router"
    if importlib.util.find_spec(package) is None:
        raise BenchError(f"{package} is not installed (pip install {package.replace('_', '-')}; the test extra has it)")
    cmd = [sys.executable, "-m", f"{package}.launch_router", "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()),
           "--policy", policy, "--worker-urls", *[r.url for r in replicas], "--worker-startup-check-interval", "1",
           # a dead replica is dropped after one failed check a second, and back after one good one
           "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold", "1",
           # and its circuit breaker, opened by the requests that failed on it, half-opens after 2 s (not a minute)
           "--cb-timeout-duration-secs", "2",
           "--log-level", "warn" if kind == "sglang" else "warning"]
    if policy == "kv_aware":
        for r in replicas:
            cmd += ["--kv-event-source", f"{r.url}=tcp://127.0.0.1:{r.events_port}"]
        cmd += ["--kv-event-model", model_name]
    return cmd


@dataclass
class Fleet:
    replicas: list[Replica]
    routers: dict[str, str] = field(default_factory=dict)  # policy (router_command's) -> the router's base URL


@contextlib.contextmanager
def fleet(model: str | None, policies: tuple[str, ...], n: int = 2, model_name: str = "tiny",
          timeout: float = 120.0, extra: tuple[str, ...] = ()) -> Iterator[Fleet]:
    """n replicas and one router per policy over them, all started at once (a router waits for its
    workers itself); everything stopped on exit. $ROUTER_FLEET_LOGS: a folder for their output."""
    folder = os.environ.get("ROUTER_FLEET_LOGS")
    logs = [open(os.path.join(folder, f"{name}.log") if folder else os.devnull, "w")
            for name in [f"replica{i}" for i in range(n)] + [f"router_{p}" for p in policies]]
    replicas, routers = [], []
    try:
        for log in logs[:n]:
            port, events_port = free_port(), free_port()
            replicas.append(Replica(replica_command(model, port, events_port, "--served-model-name", model_name,
                                                    *extra), port, events_port, log))
            replicas[-1].start()
        out = Fleet(replicas)
        for policy, log in zip(policies, logs[n:]):
            port = free_port()
            routers.append(subprocess.Popen(router_command(replicas, policy, port, model_name), stdout=log,
                                            stderr=subprocess.STDOUT))
            out.routers[policy] = f"http://127.0.0.1:{port}"
        for r in replicas:
            r.wait_healthy(timeout)
        for proc, url in zip(routers, out.routers.values()):
            wait_for(url + "/health", timeout, proc)
        yield out
    finally:
        stop_all(routers + [r.proc for r in replicas if r.proc is not None])
        for log in logs:
            log.close()


def stop_all(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
    """SIGTERM to all at once, then wait for each (SIGKILL past the timeout)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    for p in live:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
