"""A request's structured-output fields (OpenAI's response_format, vLLM's guided_*) -> one
StructuredOutput, or None for free text. At most one of them may be set.

A schema is checked here, size first (GrammarLimits.check_size: a walk bounded by the byte limit),
then its strings and depth (json_checks), before it is canonicalised and scanned for keywords: the
protocol takes schemas unchecked (json_checks.Schema) because a whole walk of a 1.3 MB schema on the
event loop, only for the byte limit to refuse it, stalled every stream's tokens."""
from __future__ import annotations

import json
from typing import Any

from runtime.errors import RequestError
from runtime.server.errors import APIError
from runtime.server.openai.json_checks import MAX_DEPTH, checked_json
from runtime.server.openai.protocol import SamplingFields
from structured.limits import GrammarLimits
from structured.spec import StructuredOutput

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output(req: SamplingFields, limits: GrammarLimits) -> StructuredOutput | None:
    """Raises APIError (400) when the fields contradict each other or a schema is missing, RequestError
    (400 naming the field) when a schema is over limits' size, not valid Unicode or too deep."""
    rf = req.response_format if req.response_format is not None and req.response_format.type != "text" else None
    given = [name for name in GUIDED if getattr(req, name) is not None] + (["response_format"] if rf else [])
    if len(given) > 1:
        raise APIError(400, f"set at most one of {', '.join(given)}: each constrains the whole output", given[1],
                       "invalid_value")
    if rf is not None:
        if rf.type == "json_object":
            return StructuredOutput("json")
        if rf.json_schema is None or not rf.json_schema.json_schema:
            raise APIError(400, "response_format of type 'json_schema' needs 'json_schema': {'name', 'schema'}",
                           "response_format", "invalid_value")
        # strict: false (not merely absent) opts into best effort: unenforceable keywords ignored, named
        return StructuredOutput.json_schema(checked_schema(rf.json_schema.json_schema, "response_format", limits),
                                            best_effort=rf.json_schema.strict is False)
    if req.guided_json is not None:
        return StructuredOutput.json_schema(checked_schema(req.guided_json, "guided_json", limits), "guided_json")
    if req.guided_regex is not None:
        return StructuredOutput("regex", req.guided_regex, "guided_regex")
    if req.guided_choice is not None:  # the schema keeps it a non-empty list of non-empty strings
        return StructuredOutput.choice(sized("choice", req.guided_choice, "guided_choice", limits))
    if req.guided_grammar is not None:
        return StructuredOutput("grammar", req.guided_grammar, "guided_grammar")
    return None


def checked_schema(value: dict[str, Any] | str, param: str, limits: GrammarLimits) -> dict[str, Any]:
    """The schema (parsed when it is JSON text): its size within limits, its strings valid Unicode and
    its nesting within json_checks' depth, checked in that order; RequestError naming param if not."""
    sized("json_schema", value, param, limits)
    try:
        schema = json.loads(value) if isinstance(value, str) else value
    except RecursionError:
        raise RequestError.invalid(param, f"nests deeper than {MAX_DEPTH} levels (the limit)") from None
    except ValueError:
        schema = None
    if not isinstance(schema, dict):
        raise APIError(400, f"{param} must be a JSON schema: an object, or its JSON text", param, "invalid_value")
    try:
        return checked_json(schema)
    except ValueError as exc:
        raise RequestError.invalid(param, str(exc)) from None


def sized(kind: str, value: Any, param: str, limits: GrammarLimits) -> Any:
    """value, once GrammarLimits.check_size has found it within the byte limit; RequestError naming param if not."""
    try:
        limits.check_size(kind, value)
    except ValueError as exc:
        raise RequestError.invalid(param, str(exc)) from None
    return value
