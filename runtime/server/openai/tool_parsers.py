"""Tool-call formats (--tool-call-parser): how tools are described to a model whose chat template
ignores them, and how calls are read back from its text.

hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5/Qwen3, Hermes, SmolLM
templates); json: the whole answer is one such object, or a list of them."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

Call = tuple[str, str]  # (function name, arguments as JSON text)

HERMES_SYSTEM = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

JSON_SYSTEM = """# Tools

You may call these functions (JSON signatures, one a line):
{tools}

To call one, answer with only a JSON object {{"name": <function-name>, "arguments": <args-json-object>}}, or a
JSON list of such objects for several calls; otherwise answer in plain text."""


def call_of(obj: Any) -> Call | None:
    """(name, arguments JSON) of {"name": str, "arguments"|"parameters": ...}, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def calls_of_json(text: str) -> list[Call] | None:
    """Calls in a JSON object or list of objects; None when text is not that."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    calls = [call_of(o) for o in (obj if isinstance(obj, list) else [obj])]
    return calls if calls and all(calls) else None


@dataclass(frozen=True)
class ToolParser:
    name: str
    system_template: str
    start: str  # text that opens a call: a stream holds back from here on

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        return self.system_template.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))

    def parse(self, text: str) -> tuple[str | None, list[Call]]:
        """(content outside the calls, or None when empty; the calls found, in order)."""
        if self.name == "json":
            calls = calls_of_json(text.strip())
            return (None, calls) if calls else (text or None, [])
        calls: list[Call] = []
        blocks = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
        for body in blocks.findall(text):
            calls += calls_of_json(body) or []
        content = blocks.sub("", text).strip() if calls else text
        return content or None, calls


PARSERS = {"hermes": ToolParser("hermes", HERMES_SYSTEM, "<tool_call>"), "json": ToolParser("json", JSON_SYSTEM, "")}
