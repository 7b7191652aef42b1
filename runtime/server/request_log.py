"""Per HTTP request: the JSON-lines access log (`--log-format json`) and the traces (runtime/server/tracing.py).

TelemetryMiddleware (outermost) opens an HttpRecord for every HTTP request and closes it when the
response is done; a generation route attaches its engine requests (RequestTelemetry.watch), whose
final outputs arrive through the AsyncEngine's observers. The line is written once both ends are
in: the response sent (or the client gone) and every engine request finished (an abort included).
Lines go to stdout, one JSON object each; the request's text only with `--log-prompts`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.outputs import RequestOutput
from runtime.server.async_engine import AsyncEngine, EngineRequest
from runtime.server.tracing import Tracer

ACCESS_LOGGER = "cute_serve.access"
TRACE_HEADERS = ("traceparent", "tracestate")
GIVE_UP_AFTER = 30.0  # seconds after the response that the engine requests may still take to finish


@dataclass
class HttpRecord:
    method: str
    path: str
    client: str | None
    headers: dict[str, str]  # the W3C trace headers and X-Request-Id, when sent
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None
    route: str | None = None
    response_sent: bool = False
    client_disconnected: bool = False
    http_done: bool = False
    ended: float | None = None  # when the response was done (perf_counter)
    logged: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    trace_context: Any = None
    trace_id: str | None = None
    model: str | None = None
    prompt: Any = None  # with --log-prompts only
    requests: dict[str, EngineRequest] = field(default_factory=dict)  # engine request id -> request
    finals: dict[str, RequestOutput] = field(default_factory=dict)

    @property
    def pending(self) -> bool:
        return len(self.finals) < len(self.requests)


CURRENT: ContextVar[HttpRecord | None] = ContextVar("cute_serve_http_record", default=None)


class RequestTelemetry:
    """One per app: the records of the generations in flight, the tracer, the access log."""

    def __init__(self, async_engine: AsyncEngine, json_log: bool, log_prompts: bool, tracer: Tracer | None) -> None:
        self.async_engine, self.tracer, self.log_prompts = async_engine, tracer, log_prompts
        self.access = _access_logger() if json_log else None
        self.watching: dict[str, HttpRecord] = {}  # engine request id -> its HTTP request
        async_engine.add_observer(self)

    def start(self, scope: Scope) -> HttpRecord:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        kept = {k: headers[k] for k in (*TRACE_HEADERS, "x-request-id") if k in headers}
        client = scope.get("client")
        rec = HttpRecord(scope.get("method", ""), scope.get("path", ""), client[0] if client else None, kept)
        if self.tracer is not None:
            rec.trace_context = self.tracer.context(kept)
        return rec

    def watch(self, response_id: str, model: str, requests: list[EngineRequest], prompt: Any) -> None:
        """A generation route's engine requests, submitted for the current HTTP request."""
        rec = CURRENT.get()
        if rec is None:  # not under the middleware (no access log, no traces configured)
            return
        rec.request_id, rec.model = response_id, model
        rec.prompt = prompt
        for r in requests:
            rec.requests[r.request_id] = r
            self.watching[r.request_id] = rec
            if self.tracer is not None:
                self.tracer.track(r.request_id)

    def on_output(self, output: RequestOutput, now: float, token_gap: float | None) -> None:
        if not output.finished or (rec := self.watching.pop(output.request_id, None)) is None:
            return
        rec.finals[output.request_id] = output
        if self.tracer is not None:
            request = rec.requests[output.request_id]
            rec.trace_id = self.tracer.export(output, request.params, request.arrival, rec.trace_context)
        if rec.http_done and not rec.pending:
            self.write(rec)

    def http_done(self, rec: HttpRecord) -> None:
        rec.http_done, rec.ended = True, time.perf_counter()
        if not rec.pending or not self.async_engine.is_running:
            self._give_up(rec)
        else:  # the aborts of a client that left come a step later; a failed step's never do
            asyncio.get_running_loop().call_later(GIVE_UP_AFTER, self._give_up, rec)

    def _give_up(self, rec: HttpRecord) -> None:
        """Write the line with what has arrived; forget the engine requests that never finished."""
        for request_id in rec.requests.keys() - rec.finals.keys():
            self.watching.pop(request_id, None)
            if self.tracer is not None:
                self.tracer.forget(request_id)
        self.write(rec)

    def write(self, rec: HttpRecord) -> None:
        if self.access is None or rec.logged:
            return
        rec.logged = True
        self.access.info(json.dumps(access_line(rec), ensure_ascii=False, separators=(",", ":")))

    def close(self) -> None:
        self.async_engine.remove_observer(self)
        if self.tracer is not None:
            self.tracer.close()


def access_line(rec: HttpRecord) -> dict[str, Any]:
    """The JSON object of one access log line."""
    line: dict[str, Any] = {
        "ts": datetime.now(timezone.utc).isoformat(timespec="milliseconds"), "request_id": rec.request_id,
        "method": rec.method, "route": rec.route or rec.path, "path": rec.path, "status": rec.status,
        "duration_s": round((rec.ended or time.perf_counter()) - rec.started, 6), "client": rec.client,
        "client_disconnected": rec.client_disconnected}
    if "x-request-id" in rec.headers:
        line["x_request_id"] = rec.headers["x-request-id"]
    if rec.requests:
        outs = list(rec.finals.values())
        ttfts = [o.metrics["ttft"] for o in outs if o.metrics.get("ttft") is not None]
        e2es = [o.metrics["e2e"] for o in outs if o.metrics.get("e2e") is not None]
        line.update({
            "model": rec.model, "prompt_tokens": sum(len(r.prompt_ids) for r in rec.requests.values()),
            "completion_tokens": sum(len(c.token_ids) for o in outs for c in o.outputs),
            "cached_tokens": sum(o.num_cached_tokens for o in outs),
            "ttft_s": round(min(ttfts), 6) if ttfts else None, "e2e_s": round(max(e2es), 6) if e2es else None,
            "finish_reasons": sorted({c.finish_reason or "unfinished" for o in outs for c in o.outputs})})
    if rec.trace_id is not None:
        line["trace_id"] = rec.trace_id
    if rec.prompt is not None:
        line["prompt"] = rec.prompt
    return line


def _access_logger() -> logging.Logger:
    """The access lines alone on stdout (the server's own log stays on stderr)."""
    log = logging.getLogger(ACCESS_LOGGER)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


class TelemetryMiddleware:
    """Outermost: sees every request, the ones the guards refuse included."""

    def __init__(self, app: ASGIApp, telemetry: RequestTelemetry) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rec = self.telemetry.start(scope)
        token = CURRENT.set(rec)

        async def receive_seen() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" and not rec.response_sent:
                rec.client_disconnected = True
            return message

        async def send_seen(message: Message) -> None:
            if message["type"] == "http.response.start":
                rec.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                rec.response_sent = True
            await send(message)

        try:
            await self.app(scope, receive_seen, send_seen)
        except BaseException:
            rec.status = rec.status or 500
            raise
        finally:
            CURRENT.reset(token)
            route = scope.get("route")
            rec.route = getattr(route, "path", None)
            self.telemetry.http_done(rec)
