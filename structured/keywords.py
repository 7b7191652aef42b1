"""JSON-schema keywords xgrammar 0.2.9 compiles without enforcing: output that obeys the grammar can
still fail the client's own validation. Found by compiling a schema with each keyword and feeding
the matcher an instance that breaks it (tests/structured/test_schema_keywords.py keeps the list
true): allOf enforces at most its first branch, the others nothing at all. oneOf is enforced as
anyOf (exact whenever its branches are disjoint, as discriminated unions are), so it is not listed."""
from __future__ import annotations

from typing import Any

UNENFORCED = ("allOf", "not", "if", "then", "else", "multipleOf", "uniqueItems", "contains", "minContains",
              "maxContains", "dependentRequired", "dependentSchemas", "dependencies", "$dynamicRef")
# keywords whose value is a map of name -> schema, or a schema, or a list of schemas
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMAS = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
            "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def unenforced_keywords(schema: Any) -> list[str]:
    """'keyword at path' for each keyword in UNENFORCED, where it stands as a keyword (a property
    named "not" is not one); paths as JSON pointers from the schema's root."""
    found, stack = [], [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        found += [f"{k} at {path or '/'}" for k in UNENFORCED if k in node]
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack += [(v, f"{path}/{key}/{_escape(k)}") for k, v in node[key].items()]
        stack += [(node[key], f"{path}/{key}") for key in _SCHEMAS if isinstance(node.get(key), dict)]
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                stack += [(v, f"{path}/{key}/{i}") for i, v in enumerate(node[key])]
    return sorted(found)


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
