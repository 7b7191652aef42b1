"""create_app: the FastAPI app over one AsyncEngine: OpenAI routes, /health, /metrics, docs, UI hook."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import RedirectResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Scope

from runtime.server import info, tokenize_routes
from runtime.server.async_engine import AsyncEngine
from runtime.server.errors import install_error_handlers
from runtime.server.grammar_compiles import CompileWaits
from runtime.server.guards import login
from runtime.server.guards.auth import ApiKeyMiddleware
from runtime.server.guards.body_limit import BodyLimitMiddleware
from runtime.server.guards.rate_limit import AuthThrottle
from runtime.server.late_page import LatePage, PrepareUI
from runtime.server.metrics import ServerMetrics
from runtime.server.openai import chat, completions, embeddings
from runtime.server.openai.logprobs import LogprobFormatter
from runtime.server.openapi import extend_openapi
from runtime.server.options import ServerOptions
from runtime.server.request_log import RequestTelemetry, TelemetryMiddleware
from runtime.server.responses import route as responses_route
from runtime.server.responses.store import ResponseStore
from runtime.server.state import ServerState
from runtime.server.tracing import Tracer
from structured.service import GrammarService, use_service


def create_app(async_engine: AsyncEngine, model_name: str = "default", options: ServerOptions | None = None,
               ui: PrepareUI | None = None) -> FastAPI:
    """The server's app; the engine's lifecycle (start/shutdown) stays with the caller.

    ui(app, async_engine) prepares the chat UI once the server runs and returns what mounts it at "/"
    (runtime/server/late_page.py); the API routes keep precedence. Without it "/" redirects to /docs.
    """
    page = LatePage(ui, async_engine) if ui is not None else None
    app = FastAPI(title="cute-serve", summary="OpenAI-compatible LLM server", version="0.1.0",
                  lifespan=page.running if page is not None else None)
    options = options or ServerOptions()
    throttle = AuthThrottle(options.auth_rate, options.auth_burst) if options.api_key else None
    limits = async_engine.limits
    compiles = CompileWaits(use_service(GrammarService(limits.tokenizer, limits.vocab_size, options.grammar)))
    compiles.service.govern(async_engine.engine.has_unfinished_requests)
    compiles.service.warm()
    app.state.responses = ResponseStore()  # /v1/responses kept for GET and previous_response_id
    metrics = ServerMetrics(async_engine, model_name, compiles.service)
    app.state.server = ServerState(async_engine, model_name, metrics, LogprobFormatter(limits.tokenizer), compiles,
                                   options, page, throttle, telemetry=telemetry(async_engine, model_name, options))
    install_error_handlers(app)
    add_guards(app, options, throttle)
    metrics.instrument(app)  # the HTTP series: outside the guards, so refused requests count too
    if app.state.server.telemetry is not None:
        app.add_middleware(TelemetryMiddleware, telemetry=app.state.server.telemetry)  # outermost
    modules = (completions, chat, embeddings, responses_route, info, tokenize_routes,
               *([login] if options.api_key else []))
    routers = [module.router for module in modules]
    for router in routers:
        app.include_router(router)
    extend_openapi(app, async_engine.limits.vocab_size, async_engine.engine.model_config.hidden_size)
    if page is not None:
        own = [r.path for r in app.routes if hasattr(r, "path")]  # docs and schema; routers come included
        page.route = PageMount(page, {_root(p) for p in own + [r.path for router in routers for r in router.routes]})
        app.router.routes.append(page.route)
        return app
    app.add_api_route("/", lambda: RedirectResponse("/docs"), include_in_schema=False)
    return app


def telemetry(async_engine: AsyncEngine, model_name: str, options: ServerOptions) -> RequestTelemetry | None:
    """The access log and the tracer, when either is asked for."""
    tracer = None
    if options.otlp_traces_endpoint:
        tracer = Tracer(async_engine, options.otlp_traces_endpoint, options.detailed_traces, model_name)
    if tracer is None and options.log_format != "json":
        return None
    return RequestTelemetry(async_engine, options.log_format == "json", options.log_prompts, tracer)


def add_guards(app: FastAPI, options: ServerOptions, throttle: AuthThrottle | None = None) -> None:
    """The middleware every request passes, outermost last (each add wraps the ones before it)."""
    app.add_middleware(BodyLimitMiddleware, max_bytes=options.max_request_bytes, timeout=options.body_timeout)
    if options.api_key:  # outside the body limit: a request without the key never has its body read
        app.add_middleware(ApiKeyMiddleware, api_key=options.api_key, metrics_public=options.metrics_public,
                           throttle=throttle)
    # Installed even with no origin allowed: Gradio then adds no CORS of its own (it grants any
    # http://localhost:* origin credentialed access). Outside the key check: preflights carry no key.
    app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins), allow_methods=["*"],
                       allow_headers=["*"])
    # Host names other than this machine's are refused first: a DNS-rebinding page cannot reach the API
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(options.allowed_hosts))


def _root(path: str) -> str:
    return path.split("/", 2)[1] if path.startswith("/") else path


class PageMount(Mount):
    """A page mounted at "/" that never claims the API's paths. A plain root mount matches every
    path in full, which outranks an API route's method-only (partial) match: GET /v1/completions
    would get the page's 404 instead of the API's 405, and /v1/unknown a 404 in the page's shape."""

    def __init__(self, page: ASGIApp, api_roots: set[str]) -> None:
        super().__init__("", app=page)
        self.api_roots = api_roots

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] in ("http", "websocket") and _root(scope["path"]) in self.api_roots:
            return Match.NONE, {}
        return super().matches(scope)
