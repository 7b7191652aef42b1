"""Work-arounds for xgrammar 0.2.9's JSON-schema converter, applied to a schema before compiling.

A string with minLength/maxLength (and no pattern) becomes `[^"\\\r\n]{m,n}` there: raw control
characters pass, which is invalid JSON. Such strings get an equivalent pattern without them
(escape sequences are not generated: a length-limited string is then plain characters)."""
from __future__ import annotations

from typing import Any

_NESTED = ("properties", "$defs", "definitions", "patternProperties")  # name -> schema maps
_CHILD = ("items", "additionalProperties", "not", "contains", "additionalItems")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
PLAIN_CHAR = r'[^"\\\x00-\x1f\x7f\ud800-\udfff]'  # nor UTF-8-encoded surrogates (invalid text)


def fix_schema(schema: Any) -> Any:
    """A copy of schema with the work-arounds applied (anything not a dict is returned as is)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("type") == "string" and "pattern" not in out and "format" not in out and (
            "minLength" in out or "maxLength" in out):
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^{PLAIN_CHAR}{{{lo},{hi}}}$"
    for key in _NESTED:
        if isinstance(out.get(key), dict):
            out[key] = {k: fix_schema(v) for k, v in out[key].items()}
    for key in _CHILD:
        if key in out:
            out[key] = fix_schema(out[key])
    for key in _LISTS:
        if isinstance(out.get(key), list):
            out[key] = [fix_schema(v) for v in out[key]]
    return out
