"""Building a request's structure into an xgrammar CompiledGrammar (in a compile worker process:
structured/compile_worker.py), and the one-line reason when it cannot be."""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from structured.schema_fixes import fix_schema

if TYPE_CHECKING:  # xgrammar (and the transformers it imports) load on the first grammar, not at start-up
    import xgrammar as xgr

ANY_OBJECT = '{"type": "object"}'
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")  # xgrammar's C++ log header


class GrammarError(ValueError):
    """A structure the engine cannot compile; the message says why, in one line."""


class GrammarBusyError(GrammarError):
    """Every compile worker is busy and the queue is full: retry later (HTTP 429)."""


def choice_grammar(choices: list[str]) -> str:
    """EBNF that matches exactly one of the strings (JSON string escapes are EBNF's too)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def build(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    """The compiled grammar for (kind, text); GrammarError when it cannot be compiled."""
    try:
        return _build(compiler, kind, text)
    except GrammarError:
        raise
    except Exception as exc:  # xgrammar raises RuntimeError / ValueError / InvalidJSONError with its reason
        why = _LOG_PREFIX.sub("", " ".join(str(exc).split())) or type(exc).__name__
        raise GrammarError(f"cannot compile the {kind.replace('_', ' ')}: {why[:500]}") from None


def _build(compiler: xgr.GrammarCompiler, kind: str, text: str) -> xgr.CompiledGrammar:
    # Compact JSON (no free whitespace): small models otherwise pad with newlines until max_tokens.
    if kind == "json":
        return compiler.compile_json_schema(ANY_OBJECT, any_whitespace=False, strict_mode=False)
    if kind == "json_schema":
        return compiler.compile_json_schema(json.dumps(fix_schema(json.loads(text))), any_whitespace=False,
                                            strict_mode=True)
    if kind == "regex":
        return compiler.compile_regex(text)
    if kind == "choice":
        return compiler.compile_grammar(choice_grammar(json.loads(text)))
    if kind == "grammar":
        return compiler.compile_grammar(text)
    raise GrammarError(f"unknown structure kind {kind!r}")
