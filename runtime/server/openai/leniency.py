"""Request fields this server does not know: accepted, ignored and named (a warning log line and the
X-Ignored-Fields response header), as vLLM and SGLang do, since real clients send extras (store,
metadata, priority, ...). --strict-api answers them with a 400 instead. Fields OpenAI
defines that this server cannot honour are always a 400."""
from __future__ import annotations

import logging
from urllib.parse import quote

from pydantic import BaseModel

from runtime.server.errors import APIError

log = logging.getLogger("cute_serve")

IGNORED_HEADER = "X-Ignored-Fields"
MAX_NAMED = 32  # fields named in the header and the log line (a body can hold thousands)
UNSUPPORTED = ("audio", "prediction", "web_search_options", "functions", "function_call")


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Dotted paths of every field the schema does not define, nested models included."""
    out = [prefix + k for k in model.model_extra or {}]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                out += unknown_fields(item, f"{prefix}{name}{'' if i is None else f'[{i}]'}.")
    return out


def check_fields(body: BaseModel, strict: bool) -> list[str]:
    """The unknown fields to ignore; APIError for an unsupported OpenAI field, or any unknown one when strict."""
    extra = body.model_extra or {}
    for name in UNSUPPORTED:
        if extra.get(name) is not None:
            raise APIError(400, f"'{name}' is not supported by this server", name, "unsupported_parameter")
    if extra.get("modalities") not in (None, ["text"]):
        raise APIError(400, "only text output is supported ('modalities': ['text'])", "modalities",
                       "unsupported_parameter")
    unknown = [f for f in unknown_fields(body) if f != "modalities"]
    if unknown and strict:
        raise APIError(400, f"unrecognized request argument supplied: '{unknown[0]}'", unknown[0], "unknown_parameter")
    if unknown:
        log.warning("ignoring unknown request fields: %s", ", ".join(map(repr, unknown[:MAX_NAMED])))
    return unknown


def header_value(names: list[str], safe: str = "._-[]") -> str:
    """The names, percent-encoded where not plain ASCII (headers are latin-1) or not in safe, the first
    MAX_NAMED only."""
    # a lone surrogate too; an empty name shown as "" (else a trailing ", " is an illegal header value)
    shown = [quote(n, safe=safe, errors="replace")[:100] or '""' for n in names[:MAX_NAMED]]
    return ", ".join(shown) + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMED else "")
