"""Tool calls read while they are written: each call's name once it is complete, then its arguments
as far as they go, so a stream can send argument deltas as the tokens arrive (as vLLM's hermes
parser does). A call is seen only when written name first, `{"name": "f", "arguments": ...`
(a "required" grammar always writes it so); one written otherwise is left to the final parse."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_SCALAR_END = re.compile(r"[\s,}\]]")
_BETWEEN = set(" \t\r\n[,}")  # what may stand between calls in a JSON list of them (a call's own "}" too)


@dataclass(frozen=True)
class ScannedCall:
    name: str
    arguments: str  # the arguments value's text so far
    complete: bool  # that value is closed
    end: int = -1  # where it closed in the text: a later scan may start there


def value_end(text: str, start: int) -> int | None:
    """Where the JSON value starting at text[start] ends (one past it), or None while it is still open."""
    if start >= len(text):
        return None
    if text[start] not in '{["':
        m = _SCALAR_END.search(text, start)
        return m.start() if m else None
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def scan_calls(text: str, opener: str = "", start: int = 0) -> list[ScannedCall]:
    """The calls in text[start:] so far, in order: each after opener (hermes' "<tool_call>"), or with
    no opener each object of a JSON list. Stops at the first call it cannot read name first."""
    calls: list[ScannedCall] = []
    pos = start
    while True:
        if opener:
            at = text.find(opener, pos)
            if at < 0:
                return calls
            pos = at + len(opener)
        m = CALL_HEAD.search(text, pos)
        if m is None or not set(text[pos:m.start()]) <= _BETWEEN:
            return calls
        try:
            name = json.loads(f'"{m.group(1)}"')
        except ValueError:
            return calls
        end = value_end(text, m.end())
        calls.append(ScannedCall(name, text[m.end():end if end is not None else len(text)], end is not None,
                                 -1 if end is None else end))
        if end is None:
            return calls
        pos = end
