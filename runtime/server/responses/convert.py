"""A Responses request as a chat completion request (instructions, input items, function tools,
text.format, the conversation of previous_response_id), and a chat answer as Response output items."""
from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import ValidationError

from runtime.server.errors import APIError
from runtime.server.openai.protocol import ChatCompletionRequest
from runtime.server.responses.protocol import (
    FunctionCallItem,
    FunctionChoice,
    MessageItem,
    ResponsesRequest,
    TextConfig,
    TextPart,
)

Messages = list[dict[str, Any]]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def input_messages(req: ResponsesRequest) -> Messages:
    """The request's own input as chat messages (instructions excluded: they do not carry over)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out: Messages = []
    for item in req.input:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
    return out


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    return [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools] if req.tools else None


def _tool_choice(choice: Any) -> Any:
    return {"type": "function", "function": {"name": choice.name}} if isinstance(choice, FunctionChoice) else choice


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema":
        return {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude={"type"},
                                                                     exclude_none=True)}
    return {"type": fmt.type}


def chat_request(req: ResponsesRequest, history: Messages) -> tuple[ChatCompletionRequest, Messages]:
    """(the chat request to run, the conversation it continues plus this input: what a later
    previous_response_id continues from)."""
    conversation = history + input_messages(req)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body = {"model": req.model, "messages": system + conversation, "tools": _tools(req),
            "tool_choice": _tool_choice(req.tool_choice), "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": _response_format(req.text), "max_completion_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "stream": req.stream,
            "stream_options": {"include_usage": True} if req.stream else None}
    try:
        return ChatCompletionRequest(**{k: v for k, v in body.items() if v is not None}), conversation
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise APIError(400, f"{where}: {first['msg']}", where, "invalid_value") from None


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat assistant message as Response output items: a message with its text, then function calls."""
    items = []
    if message.get("content"):
        items.append({"type": "message", "id": new_id("msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": message["content"], "annotations": []}]})
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "id": new_id("fc"), "call_id": call["id"], "status": "completed",
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    return items


def as_messages(items: list[dict[str, Any]]) -> Messages:
    """Output items as the chat messages a continuation sees."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
             for i in items if i["type"] == "function_call"]
    return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]


def response_object(req: ResponsesRequest, response_id: str, created: int, model: str, items: list[dict[str, Any]],
                    finish_reason: str | None, usage: dict[str, Any] | None, status: str | None = None
                    ) -> dict[str, Any]:
    """The Response, as OpenAI's API returns it."""
    cut = finish_reason == "length"
    status = status or ("incomplete" if cut else "completed")
    u = usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return {"id": response_id, "object": "response", "created_at": created, "status": status, "model": model,
            "output": items, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id, "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": req.temperature, "top_p": req.top_p, "tools": req.dump("tools") or [],
            "tool_choice": req.dump("tool_choice") or "auto", "text": req.dump("text") or {"format": {"type": "text"}},
            "store": req.store, "metadata": req.metadata or {},
            "usage": {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                      "total_tokens": u["total_tokens"],
                      "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                          "cached_tokens", 0)},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
