"""GuidedDecodingParams: vLLM's offline shape for structured output,
`SamplingParams(guided_decoding=GuidedDecodingParams(json=...))`, turned into a StructuredOutput."""
from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass
from typing import Any

from structured.compile import GrammarError
from structured.spec import StructuredOutput

PARAM = "guided_decoding"


@dataclass
class GuidedDecodingParams:
    """Exactly one of: json (a JSON schema, as a dict or text), regex, choice (a list of strings),
    grammar (EBNF, xgrammar's dialect), json_object (any JSON object)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def structured(self) -> StructuredOutput:
        """The StructuredOutput it asks for; GrammarError (a ValueError) unless exactly one is set."""
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise GrammarError(f"set exactly one of json, regex, choice, grammar, json_object (got "
                               f"{', '.join(given) or 'none'})")
        if self.json_object:
            return StructuredOutput("json", param=PARAM)
        if self.json is not None:
            return StructuredOutput.json_schema(self.json if isinstance(self.json, dict) else _schema_text(self.json),
                                                PARAM)
        if self.choice is not None:
            return StructuredOutput.choice(list(self.choice), PARAM)
        return StructuredOutput("regex", self.regex, PARAM) if self.regex is not None else \
            StructuredOutput("grammar", self.grammar, PARAM)


def _schema_text(text: str) -> str:
    try:
        jsonlib.loads(text)
    except ValueError as exc:
        raise GrammarError(f"json is not a JSON schema: {exc}") from None
    return text
