"""Grammar-constrained decoding with xgrammar, outside the runtime core.

The core never imports this package: a request's SamplingParams.structured is a StructuredOutput,
and the core only calls its methods (compile on admission, processor per sequence). The processor
is a logits processor (runtime/sampling/processors.py's hook) that also advances on accepted tokens.
Exports load on first use, so `structured.limits` (the server's flags) imports no torch.
"""
from typing import Any

__all__ = ["GuidedDecodingParams", "StructuredOutput"]


def __getattr__(name: str) -> Any:
    if name == "GuidedDecodingParams":
        from structured.guided import GuidedDecodingParams

        return GuidedDecodingParams
    if name == "StructuredOutput":
        from structured.spec import StructuredOutput

        return StructuredOutput
    raise AttributeError(name)
