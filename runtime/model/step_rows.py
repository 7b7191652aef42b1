"""Which rows of a linear's input are decode rows, for kernels that pick their route by row count.

A decode (or draft-verify) row's logits must not depend on what shares its step: greedy output with
speculation, or beside a prefill, is then the output without. Most CPU routes give a row the same bits
at any row count; the AMX tiles (quant_gemm.choose_path) round otherwise, so a linear that can take
them sends these rows down the decode route and only the rest, prefill chunk rows, to the tiles.
The model sets the count around its forward (the decode rows lead the step, AttentionBatch) and around
the LM head (every sampled row)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_DECODE_ROWS: ContextVar[int] = ContextVar("cute_serve_decode_rows", default=0)


@contextlib.contextmanager
def decode_rows(count: int) -> Iterator[None]:
    """Inside, the first `count` rows of every linear call are decode rows."""
    token = _DECODE_ROWS.set(count)
    try:
        yield
    finally:
        _DECODE_ROWS.reset(token)


def leading_decode_rows(rows: int) -> int:
    """How many of a call's first `rows` rows are decode rows (0 outside a model step)."""
    return min(rows, _DECODE_ROWS.get())
