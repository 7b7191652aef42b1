"""Tool calling on the response side: the assistant message (content and tool_calls) of a finished
choice, and OpenAI-shaped tool_calls deltas while streaming (id and name first, then arguments)."""
from __future__ import annotations

import uuid
from typing import Any

from runtime.server.openai.stream_text import safe_end
from runtime.server.openai.tool_parsers import Call, calls_of_json
from runtime.server.openai.tools import ToolPlan


def parse_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[Call]]:
    """(content, calls) of a choice's text under the plan."""
    if plan.mode == "named":  # the grammar produced the arguments alone
        return None, [(plan.name, text)]
    if plan.mode == "required":
        calls = calls_of_json(text)
        return (None, calls) if calls else (text, [])
    return plan.parser.parse(text)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def chat_message(plan: ToolPlan | None, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """(the assistant message, the finish reason): "tool_calls" when the model stopped after calling."""
    if plan is None:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = parse_calls(plan, text)
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    tool_calls = [{"id": _call_id(), "type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}, \
        "tool_calls" if finish_reason == "stop" else finish_reason


class ToolDeltas:
    """One streamed choice under a plan: content as it can be told apart from calls, the calls' deltas."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan, self.text, self.sent, self.named_id = plan, "", 0, ""

    def delta(self, piece: str) -> dict[str, Any] | None:
        self.text += piece
        plan = self.plan
        if plan.mode == "named":  # the arguments stream as they come
            if self.named_id:
                return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else None
            self.named_id = _call_id()
            return {"tool_calls": [{"index": 0, "id": self.named_id, "type": "function",
                                    "function": {"name": plan.name, "arguments": piece}}]}
        if plan.mode == "required":
            return None
        if plan.parser.start:
            safe = safe_end(self.text, plan.parser.start)
        else:  # a JSON answer is a call: hold it all back
            safe = 0 if self.text.lstrip()[:1] in ("", "{", "[") else len(self.text)
        out, self.sent = self.text[self.sent:max(self.sent, safe)], max(self.sent, safe)
        return {"content": out} if out else None

    def final(self) -> tuple[list[dict[str, Any]], bool]:
        """(deltas still to send, whether the choice made calls)."""
        if self.plan.mode == "named":
            return [], True
        _, calls = parse_calls(self.plan, self.text)
        if not calls:
            rest = self.text[self.sent:]
            return ([{"content": rest}] if rest else []), False
        out = []
        for i, (name, args) in enumerate(calls):
            out.append({"tool_calls": [{"index": i, "id": _call_id(), "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": args}}]})
        return out, True
