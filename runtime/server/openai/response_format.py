"""A request's structured-output fields (OpenAI's response_format, vLLM's guided_*) -> one
StructuredOutput, or None for free text. At most one of them may be set."""
from __future__ import annotations

import json

from runtime.server.errors import APIError
from runtime.server.openai.protocol import SamplingFields
from structured.spec import StructuredOutput

GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output(req: SamplingFields) -> StructuredOutput | None:
    """Raises APIError (400) when the fields contradict each other or a schema is missing."""
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
        return StructuredOutput.json_schema(rf.json_schema.json_schema, best_effort=rf.json_schema.strict is False)
    if req.guided_json is not None:
        if isinstance(req.guided_json, str) and not _is_object(req.guided_json):
            raise APIError(400, "guided_json must be a JSON schema: an object, or its JSON text", "guided_json",
                           "invalid_value")
        return StructuredOutput.json_schema(req.guided_json, "guided_json")
    if req.guided_regex is not None:
        return StructuredOutput("regex", req.guided_regex, "guided_regex")
    if req.guided_choice is not None:  # the schema keeps it a non-empty list of non-empty strings
        return StructuredOutput.choice(req.guided_choice)
    if req.guided_grammar is not None:
        return StructuredOutput("grammar", req.guided_grammar, "guided_grammar")
    return None


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
