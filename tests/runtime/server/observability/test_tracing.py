"""OpenTelemetry traces against a real OTLP/HTTP receiver the test starts (tests/runtime/server/observability/otlp_receiver.py):
a streamed chat's `llm_request` span with vLLM's gen_ai.* attributes, in the caller's trace (W3C
traceparent), and with detailed traces a span per engine step and phase inside it."""
import importlib.util
import json
import subprocess
import sys
import time

import httpx
import pytest

from runtime.engine_stats import PHASES
from runtime.errors import UserError
from runtime.server.options import OTEL_MISSING, check_tracing_flags
from tests.server_utils import REPO, live_server, serve_subprocess, sse_payloads, write_tiny_model
from tests.tiny_engine import tiny_engine

HAVE_OTEL = all(importlib.util.find_spec(m) for m in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http",
                                                     "opentelemetry.proto"))
needs_otel = pytest.mark.skipif(not HAVE_OTEL, reason='needs the otel extra: pip install -e ".[otel]"')
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


@pytest.fixture
def fast_export(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # the batch processor's flush interval (ms)


def stream_chat(url, headers=None, max_tokens=4):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0.5, "top_p": 0.9, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=60) as r:
        assert r.status_code == 200
        chunks = [json.loads(p) for p in sse_payloads(r.iter_lines()) if p != "[DONE]"]
    return chunks[0]["id"], chunks[-1]["usage"]


@needs_otel
def test_a_streamed_chat_is_one_span_in_the_callers_trace_with_step_and_phase_children(fast_export):
    from tests.runtime.server.observability.otlp_receiver import otlp_receiver

    with otlp_receiver() as (endpoint, receiver), \
            live_server(tiny_engine(), otlp_traces_endpoint=endpoint, detailed_traces=True) as srv:
        response_id, usage = stream_chat(srv.url, {"traceparent": TRACEPARENT, "tracestate": "vendor=one"})
        [span] = receiver.wait_for("llm_request")
        steps = receiver.wait_for("step", usage["completion_tokens"])
        phases = receiver.wait_for("forward", len(steps))
    assert (span.trace_id, span.parent_span_id, span.kind) == (TRACE_ID, PARENT_ID, SERVER_KIND)
    a = span.attributes
    assert a["gen_ai.request.id"] == f"{response_id}-0" and a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 4
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.n"]) == (4, 1)
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5) and a["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert span.end_ns - span.start_ns >= a["gen_ai.latency.e2e"] * 1e9 - 1e3  # the last step may end a hair later
    assert 0 < a["gen_ai.latency.time_in_scheduler"] < a["gen_ai.latency.e2e"]
    assert span.resource["service.name"] == "cute-serve"
    # one step span per step that produced this request's tokens, inside the request's span, in order
    assert len(steps) == 4 and all(s.parent_span_id == span.span_id and s.trace_id == TRACE_ID for s in steps)
    assert span.start_ns <= min(s.start_ns for s in steps) and max(s.end_ns for s in steps) <= span.end_ns
    by_parent = {}
    for p in receiver.spans:
        by_parent.setdefault(p.parent_span_id, []).append(p)
    forward = 0
    for step in steps:
        children = sorted(by_parent[step.span_id], key=lambda c: c.start_ns)
        assert [c.name for c in children] == list(PHASES)  # no proposer: propose is an empty phase, still timed
        assert step.start_ns == children[0].start_ns and children[-1].end_ns == step.end_ns
        assert all(x.end_ns == y.start_ns for x, y in zip(children, children[1:]))  # the timer's own stamps
        forward += sum(c.end_ns - c.start_ns for c in children if c.name == "forward")
    assert len(phases) == len(steps)
    assert a["gen_ai.latency.time_in_model_forward"] * 1e9 == pytest.approx(forward, abs=1e3 * len(steps))


@needs_otel
def test_without_traceparent_a_request_starts_its_own_trace(fast_export):
    from tests.runtime.server.observability.otlp_receiver import otlp_receiver

    with otlp_receiver() as (endpoint, receiver), live_server(tiny_engine(), otlp_traces_endpoint=endpoint) as srv:
        stream_chat(srv.url)
        body = {"prompt": ["a", "b"], "max_tokens": 2}  # two prompts: two engine requests, two spans, one trace
        assert httpx.post(srv.url + "/v1/completions", json=body, headers={"traceparent": TRACEPARENT}).status_code == 200
        spans = receiver.wait_for("llm_request", 3)
    alone = [s for s in spans if s.trace_id != TRACE_ID]
    assert len(alone) == 1 and alone[0].parent_span_id == ""
    assert "gen_ai.latency.time_in_model_forward" not in alone[0].attributes  # detailed traces are off
    assert not [s for s in receiver.spans if s.name == "step"]
    batch = [s for s in spans if s.trace_id == TRACE_ID]
    assert sorted(s.attributes["gen_ai.request.id"][-2:] for s in batch) == ["-0", "-1"]


def test_the_flag_without_the_extra_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # what an install without the extra has
    with pytest.raises(UserError, match="pip install") as err:
        check_tracing_flags("http://127.0.0.1:4318/v1/traces", None)
    assert str(err.value) == OTEL_MISSING
    hide = "import sys; sys.modules['opentelemetry.sdk.trace'] = None; sys.argv[0] = 'runtime.serve'; "
    run = "from runtime.cli import run_main; from runtime.serve import main; run_main(main, 'runtime.serve')"
    res = subprocess.run([sys.executable, "-c", hide + run, "--otlp-traces-endpoint", "http://127.0.0.1:4318"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and 'pip install -e ".[otel]"' in lines[0], res.stderr


def test_tracing_flag_checks():
    assert check_tracing_flags(None, None) is None
    with pytest.raises(UserError, match="needs --otlp-traces-endpoint"):
        check_tracing_flags(None, ["all"])
    if HAVE_OTEL:
        assert check_tracing_flags("http://h:4318", None) == "http://h:4318/v1/traces"
        assert check_tracing_flags("http://h:4318/custom", None) == "http://h:4318/custom"
        with pytest.raises(UserError, match="not an http"):
            check_tracing_flags("h:4318", None)


@needs_otel
def test_serve_flags_trace_and_log_json_end_to_end(tmp_path, fast_export):
    """`python -m runtime.serve --otlp-traces-endpoint URL --collect-detailed-traces all --log-format json`:
    the span reaches the receiver and the access line on stdout names its trace."""
    from tests.runtime.server.observability.otlp_receiver import otlp_receiver

    model = write_tiny_model(str(tmp_path / "tiny"))
    with otlp_receiver() as (endpoint, receiver), \
            serve_subprocess("--model", model, "--kv-cache-memory", "8MiB", "--otlp-traces-endpoint", endpoint,
                             "--collect-detailed-traces", "all", "--log-format", "json", timeout=120) as (url, log):
        response_id, _ = stream_chat(url, {"traceparent": TRACEPARENT}, max_tokens=2)
        [span] = receiver.wait_for("llm_request")
        assert receiver.wait_for("step", 2)
        # the span may reach the receiver before the response is done, and the line is written after it
        deadline = time.monotonic() + 20
        while not (chat := access_lines(log(), "/v1/chat/completions")) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert span.trace_id == TRACE_ID and span.attributes["gen_ai.request.id"] == f"{response_id}-0"
    [line] = chat
    assert line["trace_id"] == TRACE_ID and line["request_id"] == response_id and line["status"] == 200


def access_lines(output: str, route: str) -> list[dict]:
    """The access lines of this route among the server's finished lines (the last may be half written)."""
    lines = output.split("\n")[:-1]
    return [x for x in (json.loads(line) for line in lines if line.startswith("{")) if x["route"] == route]
