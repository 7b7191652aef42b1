"""Grammar-constrained decoding with xgrammar, outside the runtime core.

The core never imports this package: a request's SamplingParams.structured is a StructuredOutput,
and the core only calls its methods (compile on admission, processor per sequence). The processor
is a logits processor (runtime/sampling/processors.py's hook) that also advances on accepted tokens.
"""
from structured.guided import GuidedDecodingParams
from structured.spec import StructuredOutput

__all__ = ["GuidedDecodingParams", "StructuredOutput"]
