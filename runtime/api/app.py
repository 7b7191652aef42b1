"""create_app: the FastAPI app over one AsyncEngine: OpenAI routes, /health, /metrics, docs, UI hook."""
from __future__ import annotations

from typing import Callable

from fastapi import FastAPI
from fastapi.responses import RedirectResponse

from runtime.api import chat, completions, info
from runtime.api.auth import ApiKeyMiddleware
from runtime.api.errors import install_error_handlers
from runtime.api.logprobs import LogprobFormatter
from runtime.api.openapi import document_streams
from runtime.api.state import ServerState
from runtime.async_engine import AsyncEngine
from runtime.metrics import ServerMetrics

MountUI = Callable[[FastAPI, AsyncEngine], FastAPI]


def create_app(async_engine: AsyncEngine, model_name: str = "default", api_key: str | None = None,
               mount_ui: MountUI | None = None) -> FastAPI:
    """The server's app; the engine's lifecycle (start/shutdown) stays with the caller.

    mount_ui(app, async_engine) -> app mounts the chat UI at "/" (e.g. gr.mount_gradio_app); it is
    called after the API routes exist, so they keep precedence. Without it "/" redirects to /docs.
    """
    app = FastAPI(title="cute-serve", summary="OpenAI-compatible LLM server", version="0.1.0")
    app.state.server = ServerState(async_engine, model_name, ServerMetrics(async_engine),
                                   LogprobFormatter(async_engine.engine.tokenizer))
    install_error_handlers(app)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    for module in (completions, chat, info):
        app.include_router(module.router)
    document_streams(app)
    if mount_ui is not None:
        return mount_ui(app, async_engine)
    app.add_api_route("/", lambda: RedirectResponse("/docs"), include_in_schema=False)
    return app
