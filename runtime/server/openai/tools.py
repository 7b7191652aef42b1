"""Tool calling on the request side: which calls the request allows (the ToolPlan), the tools and past
calls in the prompt, and the grammar that enforces tool_choice "required" or a named function.

A chat template that never mentions `tools` (the default model's) gets them as a system message in
the parser's format (runtime/server/openai/tool_parsers.py); past assistant calls become `<tool_call>` text and
tool results `<tool_response>` blocks in a user turn, as Qwen2.5's template writes them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.server.errors import APIError
from runtime.server.openai.protocol import ChatCompletionRequest
from runtime.server.openai.response_format import sized
from runtime.server.openai.tool_parsers import PARSERS, ToolParser
from structured.limits import GrammarLimits
from structured.spec import StructuredOutput


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "auto" (parse the text), "required" (a JSON list of calls), "named" (the arguments only)
    parser: ToolParser
    name: str | None = None  # the named function


def tool_plan(req: ChatCompletionRequest, parser: str) -> ToolPlan | None:
    """None when the request offers no tools or tool_choice is "none"; 400 for a choice it cannot meet."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice needs 'tools'", "tool_choice", "invalid_value")
        return None
    if choice == "none":
        return None
    if choice not in (None, "auto") and req.response_format is not None and req.response_format.type != "text":
        raise APIError(400, "tool_choice 'required' or a named function cannot be combined with response_format",
                       "tool_choice", "invalid_value")
    if choice in (None, "auto"):
        return ToolPlan("auto", PARSERS[parser])
    if choice == "required":
        return ToolPlan("required", PARSERS[parser])
    names = [t.function.name for t in req.tools]
    if choice.function.name not in names:
        raise APIError(400, f"tool_choice names '{choice.function.name}', which is not in tools ({', '.join(names)})",
                       "tool_choice", "invalid_value")
    return ToolPlan("named", PARSERS[parser], choice.function.name)


def _parameters(function: Any) -> dict[str, Any]:
    return function.parameters or {"type": "object", "properties": {}}


def tool_structure(req: ChatCompletionRequest, plan: ToolPlan | None,
                   limits: GrammarLimits | None = None) -> StructuredOutput | None:
    """The grammar of "required" (a list of {"name", "arguments"}) or of a named function's arguments;
    limits: its size is checked before it is canonicalised (a 400 naming tools)."""
    if plan is None or plan.mode == "auto":
        return None
    if plan.mode == "named":
        fn = next(t.function for t in req.tools if t.function.name == plan.name)
        return StructuredOutput.json_schema(_sized(_parameters(fn), limits), "tools", best_effort=fn.strict is False)
    call = [{"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t.function)},
             "required": ["name", "arguments"], "additionalProperties": False} for t in req.tools]
    schema = {"type": "array", "items": {"anyOf": call}, "minItems": 1}
    if not req.parallel_tool_calls:
        schema["maxItems"] = 1
    lenient = all(t.function.strict is False for t in req.tools)  # every tool opted into best effort
    return StructuredOutput.json_schema(_sized(schema, limits), "tools", best_effort=lenient)


def _sized(schema: dict[str, Any], limits: GrammarLimits | None) -> dict[str, Any]:
    return schema if limits is None else sized("json_schema", schema, "tools", limits)


def _call_text(message: dict[str, Any]) -> str:
    calls = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, ensure_ascii=False)
             for c in message["tool_calls"]]
    return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


def chat_messages(req: ChatCompletionRequest, plan: ToolPlan | None,
                  template: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, template variables): the template gets `tools` when it reads them; else they go
    into the system message, and past calls and results are written out as text."""
    messages = [m.template_dict() for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    if template and "tools" in template:
        return messages, {"tools": tools} if plan is not None else {}
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("tool_calls"):
            m = {"role": "assistant", "content": "\n".join(x for x in (m["content"], _call_text(m)) if x)}
        elif m["role"] == "tool":
            m = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        out.append(m)
    if plan is not None:
        system = plan.parser.system_prompt(tools)
        if out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out, {}
