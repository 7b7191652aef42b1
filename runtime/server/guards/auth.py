"""--api-key: every route but /health (and /metrics with --metrics-public) wants the key, the chat
page included, checked before a body is read. API clients send `Authorization: Bearer KEY` (the
scheme in any case); a browser signs in once at /login and sends a cookie derived from the key."""
from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import Headers
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.server.errors import APIError, error_response
from runtime.server.guards.rate_limit import AuthThrottle, client_address

LOGIN_PATH = "/login"
COOKIE = "cute_serve_session"


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class KeyCheck:
    """Constant-time comparisons against the key (its SHA-256: equal lengths, so not even the key's
    length leaks), and the chat page's session cookie, an HMAC of the key rather than the key."""

    def __init__(self, api_key: str) -> None:
        self._key = _digest(api_key)
        self.session = hmac.new(api_key.encode(), b"cute-serve chat page session", hashlib.sha256).hexdigest()
        self._session = _digest(self.session)

    def key(self, given: str) -> bool:
        return hmac.compare_digest(_digest(given), self._key)

    def bearer(self, authorization: str) -> bool:
        scheme, _, token = authorization.strip().partition(" ")
        return scheme.lower() == "bearer" and self.key(token.strip())

    def cookie(self, value: str) -> bool:
        return hmac.compare_digest(_digest(value), self._session)


def too_many_failures(wait: int) -> APIError:
    return APIError(429, f"too many wrong API keys from this address; retry in {wait} s", code="too_many_key_failures",
                    headers={"Retry-After": str(wait)})


def _cookie(headers: Headers, name: str) -> str:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


class ApiKeyMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which would get between a stream and its disconnect)."""

    def __init__(self, app: ASGIApp, api_key: str, metrics_public: bool = False,
                 throttle: AuthThrottle | None = None) -> None:
        self.app = app
        self.check = KeyCheck(api_key)
        self.throttle = throttle
        self.public = {"/health", LOGIN_PATH} | ({"/metrics"} if metrics_public else set())

    def authorized(self, headers: Headers) -> bool:
        return self.check.bearer(headers.get("authorization", "")) or self.check.cookie(_cookie(headers, COOKIE))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        wait = self.throttle.retry_after(client_address(scope)) if self.throttle is not None else 0
        if wait:
            await error_response(too_many_failures(wait))(scope, receive, send)
        elif self.authorized(headers):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        elif scope["method"] in ("GET", "HEAD") and "text/html" in headers.get("accept", ""):
            await RedirectResponse(LOGIN_PATH, status_code=303)(scope, receive, send)  # a browser: sign in first
        else:
            if self.throttle is not None and headers.get("authorization"):  # a key was tried, and it was wrong
                self.throttle.failed(client_address(scope))
            err = APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
            await error_response(err)(scope, receive, send)
