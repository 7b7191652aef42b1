"""StructuredOutput: what a request's output must match, carried on SamplingParams.structured."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from structured.compile import GrammarError
from structured.keywords import unenforced_keywords
from structured.limits import GrammarLimits
from structured.processor import GrammarProcessor
from structured.schema_text import canonical_schema_text
from structured.service import service_for

Kind = Literal["json", "json_schema", "regex", "choice", "grammar"]


@dataclass
class StructuredOutput:
    """kind: "json" (any JSON object), "json_schema" (text: the schema), "regex", "choice" (text: a
    JSON list of strings), "grammar" (text: EBNF). param: the request field it came from, for errors.
    best_effort: keywords the grammar cannot enforce are ignored (see `ignored`) instead of refused.
    A server compiles it beforehand (asynchronously) and sets `compiled`."""

    kind: Kind
    text: str = ""
    param: str = "response_format"
    best_effort: bool = False
    compiled: CompiledStructure | None = field(default=None, repr=False, compare=False)

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, param: str = "response_format",
                    best_effort: bool = False) -> "StructuredOutput":
        """schema as a dict or its JSON text; either way its properties keep the order written."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise GrammarError(f"the schema is not JSON: {exc}") from None
        return cls("json_schema", canonical_schema_text(schema), param, best_effort)

    @classmethod
    def choice(cls, choices: list[str], param: str = "guided_choice") -> "StructuredOutput":
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise GrammarError("choices must be a non-empty list of non-empty strings")
        return cls("choice", json.dumps(choices), param)

    def ignored(self) -> list[str]:
        """Keywords the grammar will not enforce ('keyword at /path'); GrammarError unless best_effort."""
        if self.kind != "json_schema":
            return []
        found = unenforced_keywords(json.loads(self.text))
        if found and not self.best_effort:
            raise GrammarError(f"the schema uses keywords this server cannot enforce: {', '.join(found[:20])}; "
                               f"drop them, or set 'strict': false to have them ignored")
        return found

    def compile(self, tokenizer: Any, vocab_size: int) -> "CompiledStructure":
        """The compiled grammar (compiled now, blocking, unless a server already did); GrammarError says why not."""
        if self.compiled is None:
            self.ignored()
            service, start = service_for(tokenizer, vocab_size), time.perf_counter()
            compiled = service.compile(self.kind, self.text)
            self.compiled = CompiledStructure.under(service.limits, compiled, time.perf_counter() - start)
        return self.compiled


@dataclass(frozen=True)
class CompiledStructure:
    """A request's compiled grammar; each of its sequences takes a state of its own. mask_wait_ms:
    how long a step waits for one of its masks beyond the forward pass; mask_cpu_ms: the CPU time a
    mask may take while other requests share its steps (GrammarLimits)."""

    compiled: Any
    mask_wait_ms: float = 50.0
    seconds: float = 0.0  # what the compile took (a cache hit: next to nothing), for /metrics
    mask_cpu_ms: float = 10.0

    @classmethod
    def under(cls, limits: GrammarLimits, compiled: Any, seconds: float) -> CompiledStructure:
        return cls(compiled, limits.mask_wait_ms, seconds, limits.mask_cpu_ms)

    def processor(self, stop_ids: list[int] | set[int]) -> GrammarProcessor:
        """A fresh per-sequence grammar state; stop_ids end the grammar's output."""
        return GrammarProcessor(self.compiled, sorted(stop_ids), self.mask_wait_ms / 1000, self.mask_cpu_ms / 1000)
