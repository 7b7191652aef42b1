"""Prometheus metrics of one server, in its own CollectorRegistry (one per app, never the global one).

Names, types and buckets: runtime/server/metric_defs.py (vLLM's under `vllm:`, ours under `cute_serve:`).
Definitions (shared/DESIGN.md): TTFT = first token - arrival (queueing and tokenization included);
TPOT = (E2E - TTFT) / (output tokens - 1), 0 for a one-token answer as vLLM records it; ITL = each gap
between successive outputs of a request that carry new tokens; queue time = first scheduled - arrival;
prefill = TTFT - queue; decode = E2E - TTFT; inference = E2E - queue. Request histograms are observed
when a request finishes with "stop" or "length" (a disconnect is not a latency). Gauges and engine
counters mirror the engine's snapshot at scrape time (runtime/server/engine_collector.py).
"""
from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_fastapi_instrumentator import Instrumentator

from runtime.outputs import RequestOutput
from runtime.server.async_engine import AsyncEngine
from runtime.server.engine_collector import EngineCollector
from runtime.server.metric_defs import (
    BY_NAME,
    ENGINE_INDEX,
    KV_TIERS,
    LABELS,
    OURS,
    PROMPT_SOURCES,
    TPOT_SLOS,
    TTFT_SLOS,
    VLLM,
    VLLM_PREFILL_COUNTERS,
    VLLM_REQUEST_HISTOGRAMS,
    VLLM_STREAM_HISTOGRAMS,
    MetricDef,
    token_buckets,
)
from runtime.server.step_feed import StepRecord
from structured.service import GrammarService

FINISHED_OK = ("stop", "length")
EXCLUDED_HANDLERS = ["/metrics", "/health"]  # vLLM's probes, as its server leaves them out
# each request histogram: what it observes, from a finished request's output and request_phases()
REQUEST_VALUES = {
    "time_to_first_token_seconds": lambda out, t: t["ttft"],
    "request_time_per_output_token_seconds": lambda out, t: out.metrics.get("tpot") or 0.0,
    "e2e_request_latency_seconds": lambda out, t: t["e2e"],
    "request_queue_time_seconds": lambda out, t: t["queue"],
    "request_inference_time_seconds": lambda out, t: t["inference"],
    "request_prefill_time_seconds": lambda out, t: t["prefill"],
    "request_decode_time_seconds": lambda out, t: t["decode"],
    "request_prompt_tokens": lambda out, t: len(out.prompt_token_ids),
    "request_generation_tokens": lambda out, t: out.metrics.get("num_output_tokens"),
    "request_max_num_generation_tokens": lambda out, t: max(len(c.token_ids) for c in out.outputs),
    "request_prefill_kv_computed_tokens": lambda out, t: len(out.prompt_token_ids) - out.num_cached_tokens,
}


def request_phases(m: dict) -> dict[str, float | None]:
    """A finished request's latencies as vLLM splits them (seconds; None where a stamp is missing):
    queue (arrival to first scheduled), prefill (to the first token), decode (first token to the end),
    inference (first scheduled to the end), ttft, e2e."""
    queue, ttft, e2e = m.get("queue_time"), m.get("ttft"), m.get("e2e")

    def minus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, a - b)

    return {"queue": queue, "ttft": ttft, "e2e": e2e, "prefill": minus(ttft, queue), "decode": minus(e2e, ttft),
            "inference": minus(e2e, queue)}


class ServerMetrics:
    """The registry: per-request histograms fed by the AsyncEngine's outputs, per-step ones by its step
    feed, the engine collector, the HTTP middleware's series and the process collector."""

    def __init__(self, async_engine: AsyncEngine, model_name: str = "default",
                 grammars: GrammarService | None = None) -> None:
        self.registry = r = CollectorRegistry()
        self.base = (model_name, ENGINE_INDEX)
        max_len = async_engine.limits.max_model_len
        self.request = {d.name[len(VLLM):]: self._histogram(d, max_len) for d in VLLM_REQUEST_HISTOGRAMS}
        stream = {d.name: self._histogram(d, max_len) for d in VLLM_STREAM_HISTOGRAMS}
        self.itl, self.iteration_tokens = stream[VLLM + "inter_token_latency_seconds"], \
            stream[VLLM + "iteration_tokens_total"]
        self.ttft, self.tpot = self.request["time_to_first_token_seconds"], \
            self.request["request_time_per_output_token_seconds"]
        self.grammar = self._histogram(BY_NAME[OURS + "grammar_compile_time_seconds"], max_len)
        by_source, cached, cached_by_tier = (Counter(d.name, d.help, [*LABELS, *d.labels], registry=r)
                                             for d in VLLM_PREFILL_COUNTERS)
        self.prompt_sources = {s: by_source.labels(*self.base, s) for s in PROMPT_SOURCES}
        self.cached, self.cached_by_tier = cached.labels(*self.base), cached_by_tier.labels(*self.base, KV_TIERS[0])
        slo_def = BY_NAME[OURS + "request_slo_attained"]
        slo = Counter(slo_def.name, slo_def.help, [*LABELS, *slo_def.labels], registry=r)
        self.slo = {(a, b): slo.labels(*self.base, str(a), str(b)) for a in TTFT_SLOS for b in TPOT_SLOS}
        r.register(EngineCollector(async_engine, model_name))
        if grammars is not None:
            self._grammar_gauges(grammars)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.async_engine = async_engine
        async_engine.add_observer(self)
        async_engine.steps.add(self.on_step)

    def _histogram(self, d: MetricDef, max_model_len: int) -> Histogram:
        buckets = d.buckets if d.buckets is not None else token_buckets(max_model_len)
        parent = Histogram(d.name, d.help, [*LABELS, *d.labels], buckets=buckets, registry=self.registry)
        return parent.labels(*self.base)

    def on_output(self, output: RequestOutput, now: float, token_gap: float | None) -> None:
        if token_gap is not None:
            self.itl.observe(token_gap)
        elif any(c.delta_token_ids for c in output.outputs):  # its first tokens: the prefill is done
            self._count_prompt_sources(output)
        if output.finished and any(c.finish_reason in FINISHED_OK for c in output.outputs):
            self._observe_request(output)

    def _count_prompt_sources(self, out: RequestOutput) -> None:
        cached, external = out.num_cached_tokens, out.num_external_tokens
        self.prompt_sources["local_compute"].inc(len(out.prompt_token_ids) - cached)
        self.prompt_sources["local_cache_hit"].inc(cached - external)
        self.prompt_sources["external_kv_transfer"].inc(external)
        self.cached.inc(cached)
        self.cached_by_tier.inc(cached - external)  # the device's; the tiers below count their hits in blocks

    def _observe_request(self, out: RequestOutput) -> None:
        times = request_phases(out.metrics)
        for name, value in REQUEST_VALUES.items():
            v = value(out, times)
            if v is not None:
                self.request[name].observe(v)
        ttft, tpot = times["ttft"], out.metrics.get("tpot") or 0.0
        if ttft is not None:
            for (a, b), counter in self.slo.items():
                if ttft <= a and tpot <= b:
                    counter.inc()

    def on_step(self, step: StepRecord) -> None:
        """The step feed's listener (engine thread; Histogram.observe is thread-safe)."""
        if step.tokens > 0:
            self.iteration_tokens.observe(step.tokens)

    def instrument(self, app: FastAPI) -> None:
        """http_requests_total and http_request_duration_seconds (by handler, method, status class) as
        vLLM exports them: prometheus-fastapi-instrumentator's defaults, probes and the page left out."""
        Instrumentator(excluded_handlers=EXCLUDED_HANDLERS, registry=self.registry).instrument(app)

    def observe_grammar(self, seconds: float) -> None:
        self.grammar.observe(seconds)

    def _grammar_gauges(self, service: GrammarService) -> None:
        """Structured output's compiled-grammar cache and compiles, read when scraped."""
        read = {"grammar_cache_bytes": lambda: service.cache.bytes, "grammar_cache_entries": lambda: len(service.cache),
                "grammar_compiles_running": lambda: service.num_compiling}
        for name, value in read.items():
            d = BY_NAME[OURS + name]
            Gauge(d.name, d.help, LABELS, registry=self.registry).labels(*self.base).set_function(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def close(self) -> None:
        self.async_engine.remove_observer(self)
        self.async_engine.steps.remove(self.on_step)
