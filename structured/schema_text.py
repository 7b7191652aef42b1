"""A JSON schema's canonical text: the grammar cache's key and what the compiler reads.

xgrammar writes an object's properties in the order of the schema's `properties`, so that order is
the client's and must survive ("reasoning" before "answer"; a tool call's "name" before its
"arguments"). Everything else is order-free: keywords are sorted and whitespace dropped, so the same
schema spelled two ways shares one compile. Values that are data (const, enum, default, examples)
are kept as written."""
from __future__ import annotations

import json
from typing import Any

_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
_DATA = ("const", "enum", "default", "examples")


def canonical_schema_text(schema: dict[str, Any]) -> str:
    """Compact JSON of schema: keywords sorted, property order kept."""
    return json.dumps(_canonical(schema), separators=(",", ":"), ensure_ascii=False)


def _canonical(node: Any) -> Any:
    if isinstance(node, list):
        return [_canonical(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key in sorted(node):
        value = node[key]
        if key in _DATA:
            out[key] = value
        elif key in _NAME_MAPS and isinstance(value, dict):
            out[key] = {name: _canonical(sub) for name, sub in value.items()}
        else:
            out[key] = _canonical(value)
    return out
