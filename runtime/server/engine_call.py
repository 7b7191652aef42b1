"""A function run on the engine thread between two steps (AsyncEngine.between_steps), its result
or exception handed back to the caller's event loop."""
from __future__ import annotations

import asyncio
from typing import Any, Callable


def run_call(engine: Any, fn: Callable[[Any], Any], future: asyncio.Future, error: BaseException | None = None) -> None:
    """fn(engine) unless error already says why not (the engine failed); the outcome goes to future."""
    result = None
    if error is None:
        try:
            result = fn(engine)
        except Exception as exc:  # the caller's to answer
            error = exc

    def settle() -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    try:
        future.get_loop().call_soon_threadsafe(settle)
    except RuntimeError:  # its event loop is closed: nobody waits
        pass
