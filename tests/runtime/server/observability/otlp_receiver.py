"""A real OTLP/HTTP trace receiver for tests: an HTTP server on 127.0.0.1 that decodes each
`POST /v1/traces` body (protobuf, gzip or not) with opentelemetry-proto and keeps its spans."""
from __future__ import annotations

import contextlib
import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                with self.lock:
                    self.spans += [Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                                        s.start_time_unix_nano, s.end_time_unix_nano, _attrs(s.attributes), resource)
                                   for s in ss.spans]

    def wait_for(self, name: str, count: int = 1, timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [s for s in self.spans if s.name == name]
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{len(found)} {name!r} spans arrived within {timeout:.0f} s, wanted {count}")


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    """(the endpoint URL to export to, the receiver); stopped on exit."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces"
            if ok:
                receiver.take(body)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", receiver
    finally:
        server.shutdown()
        server.server_close()
