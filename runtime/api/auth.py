"""--api-key: every /v1 route wants `Authorization: Bearer KEY`; checked before the body is read."""
from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.api.errors import APIError, error_response


class ApiKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would get between a stream and its disconnect)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    def _authorized(self, scope: Scope) -> bool:
        given = dict(scope.get("headers") or []).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and not self._authorized(scope):
            err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
            await error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)
