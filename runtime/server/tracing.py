"""OpenTelemetry request traces, as vLLM's: `--otlp-traces-endpoint URL` exports one `llm_request` span
per engine request over OTLP (HTTP/protobuf; gRPC with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc and
its exporter installed), with the gen_ai.* attributes vLLM sets; the request's W3C `traceparent`
(and `tracestate`) makes it a child of the caller's span, in the caller's trace.
`--collect-detailed-traces` adds a `step` child span for every engine step that produced output for
the request, each with a child per phase of the step (propose, schedule, prepare, forward, sample,
output), stamped by the engine's own PhaseTimer (runtime/server/step_feed.py).

The SDK is the optional `otel` extra: nothing here imports it until a tracer is made.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Mapping

from runtime.outputs import RequestOutput
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import AsyncEngine
from runtime.server.metrics import request_phases
from runtime.server.options import PROTOCOL_ENV, check_tracing_flags
from runtime.server.step_feed import StepRecord


class SpanAttributes:
    """vLLM's attribute names (vllm/tracing: OpenTelemetry's gen_ai conventions plus its own)."""

    USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    REQUEST_ID = "gen_ai.request.id"
    REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    REQUEST_TOP_P = "gen_ai.request.top_p"
    REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    REQUEST_N = "gen_ai.request.n"
    RESPONSE_MODEL = "gen_ai.response.model"
    RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    E2E = "gen_ai.latency.e2e"
    TIME_IN_SCHEDULER = "gen_ai.latency.time_in_scheduler"
    TIME_IN_MODEL_FORWARD = "gen_ai.latency.time_in_model_forward"
    TIME_IN_MODEL_EXECUTE = "gen_ai.latency.time_in_model_execute"
    TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def _exporter(endpoint: str) -> Any:
    """OTLP over HTTP, or gRPC where OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says so (check_tracing_flags
    has made sure its package is there)."""
    if os.environ.get(PROTOCOL_ENV, "http/protobuf") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


class Tracer:
    """Spans for the requests it is told to track: made when each finishes, from its stamps."""

    def __init__(self, async_engine: AsyncEngine, endpoint: str, detailed: bool, model_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # a provider of its own, never the global one: each app (and each test) traces apart
        self.provider = TracerProvider(resource=Resource.create({"service.name": "cute-serve",
                                                                 "cute_serve.model_name": model_name}))
        self.provider.add_span_processor(BatchSpanProcessor(_exporter(check_tracing_flags(endpoint, None))))
        self.tracer = self.provider.get_tracer("cute_serve")
        self.propagator = TraceContextTextMapPropagator()
        self.detailed, self.model_name = detailed, model_name
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()  # perf_counter stamps -> epoch
        self._steps: dict[str, list[StepRecord]] = {}  # tracked request id -> steps with output for it
        self._lock = threading.Lock()
        self.async_engine = async_engine
        async_engine.steps.add(self.on_step)

    def context(self, headers: Mapping[str, str]) -> Any:
        """The caller's span context from W3C traceparent / tracestate (None: a new trace)."""
        return self.propagator.extract(headers) if "traceparent" in headers else None

    def track(self, request_id: str) -> None:
        with self._lock:
            self._steps[request_id] = []

    def on_step(self, step: StepRecord) -> None:
        with self._lock:
            for request_id in step.request_ids:
                steps = self._steps.get(request_id)
                if steps is not None:
                    steps.append(step)

    def _ns(self, perf_seconds: float) -> int:
        return int(perf_seconds * 1e9) + self.epoch_offset_ns

    def export(self, output: RequestOutput, params: SamplingParams, arrival: float, context: Any) -> str:
        """The finished request's span (and its step spans); returns its trace id (32 hex digits)."""
        from opentelemetry import trace

        with self._lock:
            steps = self._steps.pop(output.request_id, [])
        m = output.metrics
        # the last step's output phase closes just after the request's finish stamp: the span holds both
        end = max([arrival + (m.get("e2e") or 0.0)] + [step.end for step in steps])
        attrs = self._attributes(output, params, steps)
        span = self.tracer.start_span("llm_request", context=context, kind=trace.SpanKind.SERVER,
                                      start_time=self._ns(arrival), attributes=attrs)
        if self.detailed:
            self._step_spans(trace.set_span_in_context(span), steps)
        span.end(end_time=self._ns(end))
        return format(span.get_span_context().trace_id, "032x")

    def _attributes(self, out: RequestOutput, params: SamplingParams, steps: list[StepRecord]) -> dict[str, Any]:
        m, a, t = out.metrics, SpanAttributes, request_phases(out.metrics)
        attrs: dict[str, Any] = {
            a.REQUEST_ID: out.request_id, a.RESPONSE_MODEL: self.model_name,
            a.USAGE_PROMPT_TOKENS: len(out.prompt_token_ids), a.USAGE_COMPLETION_TOKENS: m.get("num_output_tokens", 0),
            a.USAGE_NUM_SEQUENCES: len(out.outputs), a.REQUEST_N: params.n, a.REQUEST_MAX_TOKENS: params.max_tokens,
            a.REQUEST_TEMPERATURE: params.temperature, a.REQUEST_TOP_P: params.top_p,
            a.RESPONSE_FINISH_REASONS: [c.finish_reason or "" for c in out.outputs],
            a.TIME_IN_SCHEDULER: _phase_sum(steps, ("schedule",)),
        }
        timings = {a.TIME_IN_QUEUE: t["queue"], a.TIME_TO_FIRST_TOKEN: t["ttft"], a.E2E: t["e2e"],
                   a.TIME_IN_MODEL_PREFILL: t["prefill"], a.TIME_IN_MODEL_DECODE: t["decode"],
                   a.TIME_IN_MODEL_INFERENCE: t["inference"]}
        attrs.update({k: v for k, v in timings.items() if v is not None})
        if self.detailed:
            attrs[a.TIME_IN_MODEL_FORWARD] = _phase_sum(steps, ("forward",))
            attrs[a.TIME_IN_MODEL_EXECUTE] = _phase_sum(steps, ("prepare", "forward", "sample"))
        return attrs

    def _step_spans(self, parent: Any, steps: list[StepRecord]) -> None:
        from opentelemetry import trace

        for i, step in enumerate(steps):
            span = self.tracer.start_span("step", context=parent, start_time=self._ns(step.start),
                                          attributes={"cute_serve.step.tokens": step.tokens,
                                                      "cute_serve.step.index": i})
            inside = trace.set_span_in_context(span)
            for phase, start, end in step.phases:
                self.tracer.start_span(phase, context=inside, start_time=self._ns(start)).end(end_time=self._ns(end))
            span.end(end_time=self._ns(step.end))

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._steps.pop(request_id, None)

    def close(self) -> None:
        """Stop listening; export what is still buffered."""
        self.async_engine.steps.remove(self.on_step)
        self.provider.shutdown()


def _phase_sum(steps: list[StepRecord], names: tuple[str, ...]) -> float:
    return sum(end - start for step in steps for phase, start, end in step.phases if phase in names)
