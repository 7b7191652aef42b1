"""Checks on every string the server renders or parses from a request: valid Unicode (JSON can carry
lone surrogates, "\\ud800", which are not text: the tokenizer, the chat template and xgrammar all
fail on them) and nesting no deeper than MAX_DEPTH (Python's json and Jinja recurse, and a deep past
tool call's arguments once ended in a RecursionError, a 500). Each failure is a ValueError inside a
pydantic validator, so the client gets a 400 that names the field."""
from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Strict

MAX_DEPTH = 64  # nested JSON arrays/objects a request's free-form values may have


def unicode_text(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from None
    return value


def checked_json(value: Any) -> Any:
    """value unchanged; ValueError for a string (key or value) that is not valid Unicode, or nesting
    deeper than MAX_DEPTH (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            unicode_text(node)
        elif isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nests deeper than {MAX_DEPTH} levels (the limit)")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, item in items:
                if isinstance(key, str):
                    unicode_text(key)
                stack.append((item, depth + 1))
    return value


def json_text(value: str) -> str:
    """A string the server parses as JSON when it is JSON (a schema, a past call's arguments): its
    parsed value passes checked_json."""
    unicode_text(value)
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels (the limit)") from None
    except ValueError:
        return value  # not JSON: it is used as text
    checked_json(parsed)
    return value


Str = Annotated[str, Strict(), AfterValidator(unicode_text)]
JsonText = Annotated[str, Strict(), AfterValidator(json_text)]
JsonObject = Annotated[dict[str, Any], AfterValidator(checked_json)]
# A schema only a grammar reads (guided_json, response_format's): checked where it is compiled
# (response_format.checked_schema), after its size, so an oversized one is never walked whole
Schema = dict[str, Any]
