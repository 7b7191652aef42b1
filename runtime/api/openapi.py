"""OpenAPI for what FastAPI cannot see: the SSE events of streaming responses.

Each event of a stream is documented the Open API 3.2 way (an object whose `data` is either
"[DONE]" or JSON matching a chunk model, or an error), so a contract checker validates every event.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from runtime.api.errors import ERROR_RESPONSES
from runtime.api.protocol import ChatCompletionChunk, CompletionChunk, ErrorResponse

REF = "#/components/schemas/{model}"
STREAM_MODELS: list[type[BaseModel]] = [CompletionChunk, ChatCompletionChunk, ErrorResponse]


def sse_content(chunk: type[BaseModel], example: str) -> dict[str, Any]:
    """The text/event-stream entry of a 200 response whose events carry `chunk` JSON."""
    payload = {"anyOf": [{"$ref": REF.format(model=chunk.__name__)}, {"$ref": REF.format(model="ErrorResponse")}]}
    event = {"type": "object", "required": ["data"],
             "properties": {"data": {"anyOf": [{"const": "[DONE]"},
                                               {"type": "string", "contentMediaType": "application/json",
                                                "contentSchema": payload}]}}}
    return {"text/event-stream": {"schema": event, "example": example}}


def generation_responses(chunk: type[BaseModel], example: str) -> dict[int | str, dict[str, Any]]:
    """The documented responses of a generation route: JSON or `chunk` events, and the errors."""
    return {200: {"content": sse_content(chunk, example), "description": "JSON, or SSE events when stream is true"},
            **ERROR_RESPONSES}


def document_streams(app: FastAPI) -> None:
    """Add the chunk models to the app's components so the event schemas' references resolve."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            _, defs = models_json_schema([(m, "serialization") for m in STREAM_MODELS], ref_template=REF)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault(name, definition)
        return app.openapi_schema

    app.openapi = openapi
