"""OpenAPI for what FastAPI cannot see: the SSE events of streaming responses, and the served model's
vocabulary, which bounds every token id.

Each event of a stream is documented the Open API 3.2 way (an object whose `data` is either
"[DONE]" or JSON matching a chunk model, or an error), so a contract checker validates every event.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from runtime.server.errors import ERROR_RESPONSES
from runtime.server.openai.protocol import ChatCompletionChunk, CompletionChunk, ErrorResponse
from runtime.server.responses.protocol import ResponseStreamEvent

REF = "#/components/schemas/{model}"
STREAM_MODELS: list[type[BaseModel]] = [CompletionChunk, ChatCompletionChunk, ResponseStreamEvent, ErrorResponse]


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


def token_id_pattern(vocab_size: int) -> str:
    """A regex for the token ids in [0, vocab_size) written as JSON object keys (no leading zeros)."""
    top = str(vocab_size - 1)
    alternatives = ["0"] + [f"[1-9][0-9]{{{k - 1}}}" for k in range(1, len(top))]  # the shorter numbers
    for i, digit in enumerate(top):  # as long as top: its first i digits, a smaller digit, any digits after
        low = 1 if i == 0 else 0
        if int(digit) > low:
            alternatives.append(f"{top[:i]}[{low}-{int(digit) - 1}][0-9]{{{len(top) - i - 1}}}")
    return "^(" + "|".join(dict.fromkeys([*alternatives, top])) + ")$"


def bound_token_ids(node: Any, vocab_size: int, hidden_size: int = 0) -> None:
    """Every schema marked x-token-id (protocol.TOKEN_ID) gets the vocabulary's bound; one marked
    x-embedding-size (an embedding's dimensions) the only size the model has."""
    if isinstance(node, dict):
        if node.get("x-embedding-size") and hidden_size:
            node["minimum"] = node["maximum"] = hidden_size
        if node.get("x-token-id"):
            if "pattern" in node:
                node["pattern"] = token_id_pattern(vocab_size)
            else:
                node["maximum"] = vocab_size - 1
        for value in node.values():
            bound_token_ids(value, vocab_size, hidden_size)
    elif isinstance(node, list):
        for value in node:
            bound_token_ids(value, vocab_size, hidden_size)


def extend_openapi(app: FastAPI, vocab_size: int, hidden_size: int = 0) -> None:
    """Add the chunk models to the app's components so the event schemas' references resolve, and
    bound the token ids by the model's vocabulary (and embedding sizes by its hidden size)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            _, defs = models_json_schema([(m, "serialization") for m in STREAM_MODELS], ref_template=REF)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault(name, definition)
            bound_token_ids(components, vocab_size, hidden_size)
        return app.openapi_schema

    app.openapi = openapi
