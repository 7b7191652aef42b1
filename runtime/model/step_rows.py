"""The step's decode rows, which lead it, for kernels that route by row count: a linear sends them down the route
their own count picks, so a decode or verify row's logits do not depend on the prefill rows beside it (the AMX
tiles round otherwise, quant_gemm.choose_path); --deterministic keeps one route at every count (greedy = no spec)."""
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
