"""A cap on request bodies (413) and on the time to send one (408), for every route, the chat
page's included: without them 48 MB of stop strings were read and parsed, and a client trickling
its body held a connection open for ever."""
from __future__ import annotations

import asyncio

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.server.errors import APIError, error_response

DISCONNECT: Message = {"type": "http.disconnect"}
CLOSE = {"Connection": "close"}  # the rest of the body is never read: the connection cannot be reused


class BodyLimitMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would get between a stream and its disconnect)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    def too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than this server takes ({self.max_bytes} bytes, "
                             f"--max-request-bytes)", code="request_too_large", headers=CLOSE)

    def too_slow(self) -> APIError:
        return APIError(408, f"the request body did not arrive within {self.timeout:g} seconds (--body-timeout)",
                        code="request_timeout", headers=CLOSE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.max_bytes:  # refused before a byte of it is read
            await error_response(self.too_large())(scope, receive, send)
            return
        guard = _Guard(self, scope, receive, send)
        await self.app(scope, guard.receive, guard.send)


class _Guard:
    """The app's receive and send for one request: counts and times the body; on a breach it answers
    413/408 itself (unless the app has begun its answer), tells the app the client is gone, and drops
    whatever the app sends after."""

    def __init__(self, limit: BodyLimitMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        self.limit, self.scope, self.inner_receive, self.inner_send = limit, scope, receive, send
        self.deadline = asyncio.get_running_loop().time() + limit.timeout
        self.received = 0
        self.complete = False  # the whole body is in
        self.started = False  # the app has begun its response
        self.refused = False

    async def receive(self) -> Message:
        if self.refused:
            return DISCONNECT
        if self.complete:  # only a disconnect can come now, whenever it comes
            return await self.inner_receive()
        try:
            message = await asyncio.wait_for(self.inner_receive(), self.deadline - asyncio.get_running_loop().time())
        except asyncio.TimeoutError:
            return await self._refuse(self.limit.too_slow())
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit.max_bytes:
                return await self._refuse(self.limit.too_large())
            self.complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self.inner_send(message)

    async def _refuse(self, err: APIError) -> Message:
        if not self.started:
            await error_response(err)(self.scope, self.inner_receive, self.inner_send)
        self.refused = True
        return DISCONNECT
