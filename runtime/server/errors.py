"""Every failure as OpenAI's {"error": {"message", "type", "param", "code"}}, with the right status.

A client's mistake is a 4xx naming the parameter; only a server bug is a 5xx. Body validation
errors are 400, as OpenAI (and vLLM) answer them, so clients catch them as BadRequestError.
"""
from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from runtime.errors import RequestError
from runtime.server.async_engine import EngineStepError, EngineUnavailableError, QueueFullError
from runtime.server.grammar_compiles import ClientGone, GrammarBusy
from runtime.server.openai.protocol import ErrorResponse

log = logging.getLogger("cute_serve")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
               429: "rate_limit_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status, err.message, err.param, err.code), err.status, headers=err.headers)


def as_api_error(exc: BaseException) -> APIError:
    """The status and message a failure shows a client (used for responses and stream error events)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), exc.param, exc.code)
    if isinstance(exc, QueueFullError):
        return APIError(429, str(exc), code="queue_full", headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, GrammarBusy):
        return APIError(429, str(exc), code="grammar_queue_full", headers={"Retry-After": "1"})
    if isinstance(exc, ClientGone):  # nobody reads it: nginx's "client closed the request"
        return APIError(499, "the client closed the request", code="client_closed")
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, EngineStepError):
        return APIError(500, str(exc), code="engine_error")
    return APIError(500, "internal server error", code="internal_error")


def _path(loc: tuple, body: Any) -> list[str]:
    """The leading part of an error's location that exists in the body (drops union member tags)."""
    path, obj = [], body
    for part in loc[1:] if loc[:1] == ("body",) else loc:
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and isinstance(part, int) and 0 <= part < len(obj):
            obj = obj[part]
        else:
            break
        path.append(str(part))
    return path


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    err = errors[0]
    kind, loc, body = err.get("type", ""), tuple(err.get("loc", ())), getattr(exc, "body", None)
    if kind == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err['msg'])}",
                        code="invalid_json")
    if kind == "missing":
        field = ".".join(str(x) for x in loc if x != "body")
        if not field:
            return APIError(400, "the request has no body: send a JSON object", code="invalid_json")
        return APIError(400, f"missing required parameter: '{field}'", field, "missing_parameter")
    if kind == "extra_forbidden":
        field = ".".join(str(x) for x in loc if x != "body")
        return APIError(400, f"unrecognized request argument supplied: '{field}'", field, "unknown_parameter")
    path = _path(loc, body)
    if not path:
        return APIError(400, "the request body must be a JSON object (with Content-Type: application/json)",
                        code="invalid_json")
    param = ".".join(path)
    # a union (e.g. prompt: string | token ids | ...) fails once per alternative: say each once
    msgs = list(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors
                              if _path(tuple(e.get("loc", ())), body) == path))[:3]
    return APIError(400, f"invalid '{param}': {'; or '.join(msgs)} (got {_short(err.get('input'))})", param,
                    "invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(HTTPException)
    async def _on_http(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(APIError(exc.status_code, str(exc.detail), headers=exc.headers))

    @app.exception_handler(APIError)
    @app.exception_handler(RequestError)
    @app.exception_handler(QueueFullError)
    @app.exception_handler(EngineUnavailableError)
    @app.exception_handler(EngineStepError)
    @app.exception_handler(GrammarBusy)
    @app.exception_handler(ClientGone)
    async def _on_known(request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_api_error(exc))

    @app.exception_handler(Exception)
    async def _on_bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(as_api_error(exc))


def _error_doc(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description, **extra}


# What the /v1 routes document (schemathesis holds the server to it).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error_doc("Invalid request: malformed JSON, a wrong type or value, a prompt that does not fit"),
    401: _error_doc("Missing or wrong API key"),
    404: _error_doc("Unknown model"),
    408: _error_doc("The request body took longer than --body-timeout to arrive"),
    413: _error_doc("The request body is larger than --max-request-bytes"),
    422: _error_doc("Not produced by this server (validation errors are 400, as OpenAI's); listed for "
                    "FastAPI's generated schema"),
    429: _error_doc("The server is at capacity (--max-queue, or grammar compiles queued), or a client address "
                    "failed the API key check too often",
                    headers={"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}),
    503: _error_doc("The engine is not running"),
}
