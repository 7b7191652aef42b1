"""The chat page, mounted once the server already answers: /health and the OpenAI API do not wait for
the seconds of Gradio imports and page building a UI costs.

A UI hook `prepare(app, engine)` runs on a thread of its own after start-up (imports, building the
page) and returns `mount(app)`, run on the event loop, which mounts the page at "/" as
gr.mount_gradio_app does: it may add routes to the app and wrap the app's lifespan. The routes it
adds go before the page's place, the page it mounts is served from that place, and the lifespan it
wraps around the app's own (Gradio's queue) is entered then, and left when the server shuts down.

Until then the page's paths answer 503 with Retry-After (a browser gets a page that reloads itself)
and /health says "chat_page": "loading"; then "ready", or "failed" (the page's paths answer 500 with
the reason, the API keeps serving).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, AsyncIterator, Callable, Literal

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from runtime.server.async_engine import AsyncEngine
from runtime.server.errors import APIError, error_response

log = logging.getLogger("cute_serve")

MountPage = Callable[[FastAPI], FastAPI]
PrepareUI = Callable[[FastAPI, AsyncEngine], MountPage]
PageStatus = Literal["loading", "ready", "failed"]

RETRY_AFTER = {"Retry-After": "1"}
LOADING_HTML = """<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1">
<title>cute-serve</title></head><body style="font-family:sans-serif">
<p>The chat page is loading; this page reloads itself. The API (<a href="/docs">/docs</a>) already answers.</p>
</body></html>"""


class LatePage:
    """An ASGI app in the page's place: the page once mounted, a loading (or failure) answer before."""

    def __init__(self, prepare: PrepareUI, engine: AsyncEngine) -> None:
        self.prepare, self.engine = prepare, engine
        self.status: PageStatus = "loading"
        self.reason = ""
        self.page: Any = None  # the mounted page's ASGI app
        self.route: Mount | None = None  # where the app routes to this page; create_app sets it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.page is not None:
            await self.page(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
        elif self.status == "failed":
            await error_response(APIError(500, f"the chat page failed to load: {self.reason}",
                                          code="chat_page_failed"))(scope, receive, send)
        elif scope["method"] in ("GET", "HEAD") and "text/html" in _header(scope, b"accept"):
            await HTMLResponse(LOADING_HTML, 503, headers=RETRY_AFTER)(scope, receive, send)
        else:
            err = APIError(503, "the chat page is still loading; the API already answers", code="chat_page_loading",
                           headers=RETRY_AFTER)
            await error_response(err)(scope, receive, send)

    @contextlib.asynccontextmanager
    async def running(self, app: FastAPI) -> AsyncIterator[None]:
        """The app's lifespan: load the page in the background while the server serves."""
        stop = asyncio.Event()
        task = asyncio.create_task(self._load(app, stop))
        try:
            yield
        finally:
            stop.set()
            if self.page is None:  # still preparing: stop waiting for the thread (a daemon)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _load(self, app: FastAPI, stop: asyncio.Event) -> None:
        try:
            mount = await on_thread(self.prepare, app, self.engine)
            page, lifespan = self._mount(app, mount)
            async with lifespan(app):
                self.page, self.status = page, "ready"
                log.info("chat page ready")
                await stop.wait()
        except Exception as exc:  # noqa: BLE001 - the API keeps serving; the page says why it is missing
            log.exception("the chat page failed to load; the API keeps serving")
            self.status, self.reason = "failed", " ".join(str(exc).split())[:300] or type(exc).__name__

    def _mount(self, app: FastAPI, mount: MountPage) -> tuple[Any, Callable]:
        """Run mount(app) on the loop; (the page it mounted at "/", the lifespan it wrapped around ours)."""
        before = list(app.router.routes)
        own_lifespan = app.router.lifespan_context
        app.router.lifespan_context = _no_lifespan  # what mount wraps around it is the page's alone
        try:
            mount(app)
            page_lifespan = app.router.lifespan_context
        finally:
            app.router.lifespan_context = own_lifespan
            added = [r for r in app.router.routes if all(r is not old for old in before)]
            app.router.routes = before
        pages = [r for r in added if isinstance(r, Mount) and r.path == ""]
        if len(pages) != 1:
            raise RuntimeError(f"the UI hook mounted {len(pages)} pages at '/', not one")
        extra = [r for r in added if r is not pages[0]]
        app.router.routes = [r for r in before if r is not self.route] + extra + [self.route]
        return pages[0].app, page_lifespan


async def on_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on a daemon thread of its own: unlike the loop's executor, a shutdown never waits
    for it (a Gradio import takes seconds)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def deliver(set_outcome: Callable[[Any], None], value: Any) -> None:
        def settle() -> None:
            if not done.done():
                set_outcome(value)
        with contextlib.suppress(RuntimeError):  # the loop closed first: nobody waits any more
            loop.call_soon_threadsafe(settle)

    def run() -> None:
        try:
            result = fn(*args)
        except Exception as exc:  # noqa: BLE001 - handed to the awaiting task
            deliver(done.set_exception, exc)
        else:
            deliver(done.set_result, result)

    threading.Thread(target=run, name="chat-page", daemon=True).start()
    return await done


@contextlib.asynccontextmanager
async def _no_lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield


def _header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == name), "")
