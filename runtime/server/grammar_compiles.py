"""A request's grammar compiled before it is admitted, awaited on the event loop (never in the step,
never in a thread that outlives the request): the compile is cancelled, and its worker process
killed, when the client leaves or shutdown's grace period ends; shutdown waits for compiles too."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request

from runtime.errors import RequestError
from runtime.server.async_engine import EngineUnavailableError
from structured.compile import GrammarBusyError, GrammarError
from structured.service import GrammarService
from structured.spec import CompiledStructure, StructuredOutput


class ClientGone(Exception):
    """The client disconnected before its request was admitted (nothing is left to answer)."""


class GrammarBusy(Exception):
    """Every compile worker is busy and the queue is full (HTTP 429)."""


class CompileWaits:
    """The compiles requests are waiting for, so shutdown can wait for and then cancel them."""

    def __init__(self, service: GrammarService) -> None:
        self.service = service
        self._waiting: set[asyncio.Future] = set()
        self.closing = False  # shutdown cancelled what was left: those clients get a 503

    def __len__(self) -> int:
        return len(self._waiting)

    async def compile(self, structure: StructuredOutput, request: Request | None) -> list[str]:
        """Set structure.compiled; the schema keywords it ignores (best effort); RequestError (naming
        the field) when it cannot be compiled."""
        try:
            ignored = structure.ignored()  # refuses keywords it would not enforce, unless best effort
            waiter = self.service.submit(structure.kind, structure.text)
        except GrammarBusyError as exc:
            raise GrammarBusy(str(exc)) from None
        except GrammarError as exc:
            raise RequestError.invalid(structure.param, str(exc)) from None
        done, start = asyncio.wrap_future(waiter), time.perf_counter()
        self._waiting.add(done)
        try:
            compiled = await _unless_gone(done, request)
        except GrammarError as exc:
            raise RequestError.invalid(structure.param, str(exc)) from None
        except BaseException:  # gone, cancelled by shutdown, or this task cancelled: nobody waits for it now
            self.service.cancel(waiter)
            if self.closing:
                raise EngineUnavailableError("the server is shutting down") from None
            raise
        finally:
            self._waiting.discard(done)
        structure.compiled = CompiledStructure.under(self.service.limits, compiled, time.perf_counter() - start)
        return ignored

    def cancel_all(self) -> None:
        """Shutdown's grace is over: every compile still awaited is cancelled (its client gets a 503)."""
        self.closing = True
        for done in list(self._waiting):
            done.cancel()


async def _unless_gone(done: asyncio.Future, request: Request | None) -> Any:
    """done's result; ClientGone (the compile cancelled) if the client disconnects first."""
    if request is None:
        return await done
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not done.done():
        done.cancel()
        raise ClientGone()
    return done.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
