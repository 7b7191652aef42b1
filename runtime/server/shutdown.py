"""SIGTERM / SIGINT: stop admitting, let requests in flight finish for a grace period, then abort the
rest so every client still gets an ending (a last chunk with finish_reason "abort", an error event
and [DONE]; a JSON 503), and exit with status 0. Requests still waiting for their grammar to compile
count as in flight: at the end of the grace period their compiles are killed and they get the 503.

Plain uvicorn cut streams at its graceful timeout (clients saw "incomplete chunked read", JSON
clients a text/plain 500, the log CancelledError tracebacks) and re-raised the signal after
shutting down, so the process died of it (-15; 130 for Ctrl-C).
"""
from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import uvicorn

from runtime.server.async_engine import AsyncEngine
from runtime.server.grammar_compiles import CompileWaits

log = logging.getLogger("cute_serve")

# After the aborts, how long uvicorn waits for the last chunks to go out before it cancels what is left.
FLUSH_SECONDS = 5.0


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, grace: float,
                 compiles: CompileWaits | None = None) -> None:
        config.timeout_graceful_shutdown = FLUSH_SECONDS
        super().__init__(config)
        self.engine = engine
        self.compiles = compiles
        self.grace = grace
        self.draining_since: float | None = None
        self.aborted = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # the signal is not recorded (uvicorn re-raises recorded ones after shutdown): this exit is clean
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            self.engine.drain()  # new requests: 503 engine_unavailable; /health: 503
            log.info("%s: finishing the requests in flight (up to %gs), refusing new ones",
                     signal.Signals(sig).name, self.grace)
        elif sig == signal.SIGINT:  # a second Ctrl-C: stop waiting
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.draining_since is not None and not self.should_exit:
            compiling = len(self.compiles) if self.compiles is not None else 0
            if self.engine.num_seqs_in_flight == 0 and compiling == 0:
                self.should_exit = True
            elif not self.aborted and time.monotonic() - self.draining_since >= self.grace:
                self.aborted = True
                log.warning("aborting %d sequences still running and %d grammar compiles after the %gs grace period",
                            self.engine.num_seqs_in_flight, compiling, self.grace)
                self.engine.abort_all()
                if self.compiles is not None:
                    self.compiles.cancel_all()  # each waiting client gets the JSON 503
        return await super().on_tick(counter)
