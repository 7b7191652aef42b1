"""What one request's grammar may cost: input sizes checked before anything compiles, the time a
compile may take, the bytes the compiled-grammar cache holds, and how long a step waits for a mask.

Sizes are checked up front because compile time grows far faster than the text: on the default
model's 49k vocabulary a 20,000-string enum compiled for ~60 s and 256 choices of 2 KB for 82 s.
The enum figures are OpenAI's own structured-output limits (1,000 values, 15,000 characters).

A server checks a parsed schema's size (check_size) before anything else reads all of it: walking,
canonicalising and keyword-scanning a 1.3 MB schema held its event loop for 0.3-1.5 s on a busy
2-core machine, before the byte limit refused it, and every stream's tokens waited meanwhile."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from structured.compile import GrammarError

MiB = 2**20
MAX_ENUM_VALUES = 1000  # enum / const strings and guided_choice entries of one structure, together
MAX_ENUM_CHARS = 15_000  # their characters, together
MAX_GRAMMAR_RULES = 1000  # `::=` in an EBNF grammar
MAX_SCHEMA_DEPTH = 32  # nested schemas (objects in objects, items of items ...)
SLOW_MASKS = 3  # masks in a row over --max-mask-cpu-ms that end a sequence (one slow mask may be a hiccup)
_RULE = re.compile(r"::=")


@dataclass(frozen=True)
class GrammarLimits:
    """Budgets of structured output; the flags of `python -m runtime.serve` that set them are named in
    each refusal, so a client knows which limit it met."""

    max_bytes: int = 64 * 1024  # --max-grammar-bytes: a schema's JSON, a regex, an EBNF grammar, the choices
    compile_seconds: float = 10.0  # --max-grammar-compile-seconds: then the compile is killed
    compile_workers: int = 2  # --grammar-compile-workers: processes compiling at once (others queue)
    max_queued: int = 64  # compiles waiting for a worker; more are refused (HTTP 429)
    # --grammar-compile-cpu-share: of the CPU the workers get while the engine has requests
    # (compile_governor.py); 1: no cap
    compile_cpu_share: float = 0.25
    cache_bytes: int = 512 * MiB  # --grammar-cache-bytes: compiled grammars kept, by their own memory size
    mask_wait_ms: float = 50.0  # --max-mask-wait-ms: a step's wait for one mask beyond its forward pass
    # --max-mask-cpu-ms: a mask's CPU time beyond which, SLOW_MASKS in a row beside other requests, the
    # grammar is stopped. A JSON schema's masks take under 0.5 ms over a 49k vocabulary; the fills of an
    # ambiguous grammar grow with every token, and up to 50 ms took a core from the batch's forward.
    mask_cpu_ms: float = 10.0

    def check_size(self, kind: str, value: Any) -> None:
        """GrammarError naming --max-grammar-bytes when value (a parsed schema or list of choices, or
        a text) is surely larger than max_bytes as JSON; it walks only until it knows."""
        if json_chars_over(value, self.max_bytes):
            raise GrammarError(f"the {_what(kind)} is more than {self.max_bytes} bytes; this server compiles at most "
                               f"{self.max_bytes} (--max-grammar-bytes)")

    def check(self, kind: str, text: str) -> None:
        """GrammarError naming the limit when the structure is larger than these limits allow."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise GrammarError(f"the {_what(kind)} is {size} bytes; this server compiles at most {self.max_bytes} "
                               f"(--max-grammar-bytes)")
        if kind == "grammar" and len(_RULE.findall(text)) > MAX_GRAMMAR_RULES:
            raise GrammarError(f"the grammar has more than {MAX_GRAMMAR_RULES} rules (the limit)")
        if kind in ("json_schema", "choice"):
            _check_strings(json.loads(text), kind)


def json_chars_over(value: Any, limit: int) -> bool:
    """Whether value's compact JSON has more than limit characters (its UTF-8 bytes are at least as
    many), counted only until it has: the cost is bounded by limit, not by value's size."""
    size, stack = -1, [value]  # -1: the outermost value is no member, with no comma after it
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            items = ((key, item) for key, item in node.items())
        elif isinstance(node, list):
            items = ((None, item) for item in node)
        else:
            items = iter([(None, node)])
        for key, item in items:  # each member: its key, quotes, colon, comma; a string counted at once
            size += (len(key) + 4 if isinstance(key, str) else 1) + (len(item) + 2 if isinstance(item, str) else 0)
            if isinstance(item, (dict, list)):
                stack.append(item)
            if size > limit:
                return True
    return False


def _what(kind: str) -> str:
    return {"json_schema": "JSON schema", "choice": "list of choices", "regex": "regex"}.get(kind, kind)


def _check_strings(value: Any, kind: str) -> None:
    """Count the enum/const strings (or the choices) and their characters; also the schema's depth."""
    count, chars = 0, 0
    stack = [(value, 0, kind == "choice")]
    while stack:
        node, depth, literal = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels (the limit)")
        if isinstance(node, str) and literal:
            count, chars = count + 1, chars + len(node)
        elif isinstance(node, dict):
            stack += [(v, depth + 1, literal or k in ("enum", "const")) for k, v in node.items()]
        elif isinstance(node, list):
            stack += [(v, depth + 1, literal) for v in node]
    if count > MAX_ENUM_VALUES or chars > MAX_ENUM_CHARS:
        what = "choices" if kind == "choice" else "enum and const strings"
        raise GrammarError(f"{count} {what} of {chars} characters in all: this server takes at most "
                           f"{MAX_ENUM_VALUES} of at most {MAX_ENUM_CHARS} characters (the limit)")
