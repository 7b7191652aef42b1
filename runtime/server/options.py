"""What the server flags of `python -m runtime.serve` set; one per app. No heavy imports: --help reads
the defaults from here."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runtime.errors import UserError
from structured.limits import GrammarLimits

DEFAULT_MAX_TOKENS = 1024  # a request without max_tokens gets at most this (and at most what is left of the context)
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024  # the largest request body read (413 beyond it)
DEFAULT_BODY_TIMEOUT = 30.0  # seconds a client may take to send its whole request body (408 after it)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")  # Host headers always accepted
OTEL_MISSING = ('--otlp-traces-endpoint needs OpenTelemetry, which is not installed: pip install -e ".[otel]" '
                "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)")
DETAILED_MODULES = ("model", "worker", "all")  # vLLM's choices; here each turns the phase spans on
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None  # every route but /health wants it
    metrics_public: bool = False  # /metrics without the key
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS  # Host headers answered ("*": any); others get 400
    allowed_origins: tuple[str, ...] = ()  # CORS: origins whose pages may call the server (none by default)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # 0: the rest of the context, as vLLM
    tool_call_parser: str = "hermes"  # how `tool_choice: auto` output is parsed (runtime/server/openai/tool_parsers.py)
    reasoning_parser: str | None = None  # splits <think>...</think> into reasoning_content (runtime/server/openai/reasoning.py)
    embedding_pooling: str = "mean"  # /v1/embeddings: "mean" or "last" token (runtime/model/pooling.py)
    strict_api: bool = False  # unknown request fields are 400s instead of ignored and named
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # the model's, for fields a request omits
    log_format: str = "text"  # "json": one JSON line per HTTP request on stdout (runtime/server/request_log.py)
    log_prompts: bool = False  # access lines carry the request's prompt or messages (off: never its text)
    otlp_traces_endpoint: str | None = None  # OTLP/HTTP URL that gets a span per request (runtime/server/tracing.py)
    detailed_traces: bool = False  # spans for each engine step and phase under each request's span
    grammar: GrammarLimits = field(default_factory=GrammarLimits)  # structured output's budgets
    auth_rate: float = 1.0  # failed key checks (/login, a wrong Bearer key) a client address may make a second ...
    auth_burst: int = 10  # ... after this many in a row (a token bucket; then 429 with Retry-After)


def host_header_name(host: str) -> str | None:
    """The Host header name that --host ADDRESS stands for, or None for a wildcard bind ("0.0.0.0", "::")."""
    if host in ("", "0.0.0.0", "::"):
        return None
    return f"[{host.lower()}]" if ":" in host else host.lower()


def allowed_hosts(bind_host: str, extra: list[str] | None = None) -> tuple[str, ...]:
    """localhost, 127.0.0.1, [::1], the --host address when it names one, and --allowed-hosts."""
    named = host_header_name(bind_host)
    return tuple(dict.fromkeys([*LOCAL_HOSTS, *([named] if named else []), *(extra or [])]))


def check_tracing_flags(endpoint: str | None, detailed: list[str] | None) -> str | None:
    """The OTLP endpoint as the exporter takes it, or None for no tracing; UserError (one line) for
    flags that cannot work: the extra missing, a URL that is none, detailed traces without an endpoint."""
    if endpoint is None:
        if detailed:
            raise UserError("--collect-detailed-traces needs --otlp-traces-endpoint")
        return None
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise UserError(OTEL_MISSING) from None
    if os.environ.get(PROTOCOL_ENV, "http/protobuf") == "grpc":
        try:
            import opentelemetry.exporter.otlp.proto.grpc.trace_exporter  # noqa: F401
        except ImportError:
            raise UserError(f"{PROTOCOL_ENV}=grpc needs opentelemetry-exporter-otlp-proto-grpc") from None
        return endpoint
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise UserError(f"--otlp-traces-endpoint {endpoint!r} is not an http(s) URL (e.g. http://HOST:4318/v1/traces)")
    return endpoint if url.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"
