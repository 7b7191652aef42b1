"""Tool calling on the response side: the assistant message (content and tool_calls) of a finished
choice, and OpenAI-shaped tool_calls deltas while streaming: a call's id and name once its name is
written, then its arguments as the tokens arrive (runtime/server/openai/call_scanner.py), in every mode."""
from __future__ import annotations

import uuid
from typing import Any

from runtime.server.openai.call_scanner import ScannedCall, scan_calls
from runtime.server.openai.stream_text import safe_end
from runtime.server.openai.tool_parsers import Call, calls_of_json
from runtime.server.openai.tools import ToolPlan


def parse_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[Call]]:
    """(content, calls) of a choice's text under the plan."""
    if plan.mode == "named":  # the grammar produced the arguments alone
        return None, [(plan.name, text)]
    if plan.mode == "required":  # cut short (max_tokens), the calls written whole are kept
        calls = calls_of_json(text) or [(c.name, c.arguments) for c in scan_calls(text) if c.complete]
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
    """One streamed choice under a plan: content as it can be told apart from calls, each call's deltas
    as it is written; final() sends what the last tokens completed and the calls only the parse found."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan, self.text, self.sent, self.named_id = plan, "", 0, ""
        self.streamed: list[int] = []  # per call streamed so far: the argument characters sent
        self._closed: list[ScannedCall] = []  # calls whose arguments are complete
        self._resume = 0  # where the text after them starts

    def delta(self, piece: str) -> dict[str, Any] | None:
        self.text += piece
        plan = self.plan
        if plan.mode == "named":  # the arguments stream as they come
            if self.named_id:
                return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else None
            self.named_id = _call_id()
            return {"tool_calls": [{"index": 0, "id": self.named_id, "type": "function",
                                    "function": {"name": plan.name, "arguments": piece}}]}
        out: dict[str, Any] = {}
        if plan.mode == "auto" and not self.streamed:
            if plan.parser.start:
                safe = safe_end(self.text, plan.parser.start)
            else:  # a JSON answer is a call: hold it all back
                safe = 0 if self.text.lstrip()[:1] in ("", "{", "[") else len(self.text)
            if safe > self.sent:
                out["content"], self.sent = self.text[self.sent:safe], safe
        calls = self._call_deltas(self._scanned())
        if calls:
            out["tool_calls"] = calls
        return out or None

    def _scanned(self) -> list[ScannedCall]:
        """The calls so far; those closed are kept, so each token rescans only the call still open."""
        if self.plan.mode == "required" or not self.plan.parser.start:
            if self.text.lstrip()[:1] not in ("{", "["):
                return []
            fresh = scan_calls(self.text, "", self._resume)
        else:
            fresh = scan_calls(self.text, self.plan.parser.start, self._resume)
        while fresh and fresh[0].complete:
            self._closed.append(fresh.pop(0))
            self._resume = self._closed[-1].end
        return self._closed + fresh

    def _call_deltas(self, scanned: list[ScannedCall]) -> list[dict[str, Any]]:
        out = []
        for i, call in enumerate(scanned):
            if i == len(self.streamed):
                out.append({"index": i, "id": _call_id(), "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments}})
                self.streamed.append(len(call.arguments))
            elif len(call.arguments) > self.streamed[i]:
                out.append({"index": i, "function": {"arguments": call.arguments[self.streamed[i]:]}})
                self.streamed[i] = len(call.arguments)
        return out

    def final(self) -> tuple[list[dict[str, Any]], bool]:
        """(deltas still to send, whether the choice made calls)."""
        if self.plan.mode == "named":
            return [], True
        _, calls = parse_calls(self.plan, self.text)
        if not calls and not self.streamed:
            rest = self.text[self.sent:]
            return ([{"content": rest}] if rest else []), False
        out = [{"tool_calls": [d]} for d in self._call_deltas(self._scanned())]
        for i, (name, args) in enumerate(calls[len(self.streamed):], start=len(self.streamed)):
            out.append({"tool_calls": [{"index": i, "id": _call_id(), "type": "function",
                                        "function": {"name": name, "arguments": args}}]})
        return out, True
