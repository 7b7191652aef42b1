"""StructuredOutput: what a request's output must match, carried on SamplingParams.structured."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from structured.compile import GrammarError, compile_cached
from structured.processor import GrammarProcessor

Kind = Literal["json", "json_schema", "regex", "choice", "grammar"]


@dataclass
class StructuredOutput:
    """kind: "json" (any JSON object), "json_schema" (text: the schema), "regex", "choice" (text: a
    JSON list of strings), "grammar" (text: EBNF). param: the request field it came from, for errors."""

    kind: Kind
    text: str = ""
    param: str = "response_format"

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, param: str = "response_format") -> "StructuredOutput":
        return cls("json_schema", schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True), param)

    @classmethod
    def choice(cls, choices: list[str], param: str = "guided_choice") -> "StructuredOutput":
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError("choices must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(choices), param)

    def compile(self, tokenizer: Any, vocab_size: int) -> "CompiledStructure":
        """Compile (or fetch from the cache) over this tokenizer; GrammarError (a ValueError) says why not."""
        start = time.perf_counter()
        compiled = compile_cached(tokenizer, vocab_size, self.kind, self.text)
        return CompiledStructure(compiled, time.perf_counter() - start)


@dataclass(frozen=True)
class CompiledStructure:
    """A request's compiled grammar; each of its sequences takes a state of its own."""

    compiled: Any
    seconds: float = 0.0  # what compile() took (a cache hit: next to nothing), for /metrics

    def processor(self, stop_ids: list[int] | set[int]) -> GrammarProcessor:
        """A fresh per-sequence grammar state; stop_ids end the grammar's output."""
        return GrammarProcessor(self.compiled, sorted(stop_ids))
