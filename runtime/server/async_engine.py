"""AsyncEngine: the LLMEngine step loop on its own thread, streaming outputs to asyncio code.

The engine thread alone touches the LLMEngine (it is not thread-safe). Callers on an event loop
submit requests (validated and tokenized beforehand, so the step loop never waits on them); the
commands (add / abort) queue up and the engine thread applies them between steps, sleeping on an
event while there is no work. After each step the outputs go back to each request's event loop
with one call_soon_threadsafe per loop, into per-request-group asyncio queues (RequestStream).
Closing a stream before it finishes aborts its requests: their KV blocks are free before the next
step runs.

Handlers and the UI see only this face: `limits` (tokenize and check requests; fixed, any thread),
`describe()`, `snapshot()` (the engine's metrics as of its last step, with the block map at most
every BLOCK_STATES_EVERY seconds), submit / abort, reset_stats(), and drain / abort_all for a
graceful shutdown; never the LLMEngine itself.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, TypeVar

from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats
from runtime.errors import EngineDeadError, RequestError
from runtime.outputs import RequestOutput
from runtime.request_limits import Admitted, RequestLimits
from runtime.sampling_params import SamplingParams
from runtime.server.engine_call import run_call
from runtime.server.step_feed import StepFeed

log = logging.getLogger("cute_serve")

T = TypeVar("T")
BLOCK_STATES_EVERY = 0.5  # seconds between copies of the per-block states (the UI's map) into snapshots


class QueueFullError(Exception):
    """More requests are in flight than the server admits; retry later (HTTP 429)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineUnavailableError(Exception):
    """The engine thread has stopped or failed; nothing can be served (HTTP 503)."""


class EngineStepError(Exception):
    """A step raised while this request was in flight (a server bug, HTTP 500)."""


@dataclass
class EngineRequest:
    """One prompt, admitted (tokenized, validated, its grammar compiled), ready for the engine thread."""

    request_id: str
    admitted: Admitted
    arrival: float = field(default_factory=time.perf_counter)  # TTFT and queue time count from here

    @property
    def prompt_ids(self) -> list[int]:
        return self.admitted.prompt_ids

    @property
    def params(self) -> SamplingParams:
        return self.admitted.params


class OutputObserver(Protocol):
    """Sees every output (of every stream, closed or not) on the stream's event loop."""

    def on_output(self, output: RequestOutput, now: float, token_gap: float | None) -> None:
        """token_gap: seconds since this request's previous output with tokens, when both carry tokens."""


class RequestStream:
    """Outputs of a group of requests (one prompt x n, or a batch of prompts), in engine order.

    Iterate with `async for`; it ends after the last request finishes. close() (idempotent) aborts
    whatever has not finished: always call it, e.g. in a finally block.
    """

    def __init__(self, owner: "AsyncEngine", requests: Sequence[EngineRequest], loop: asyncio.AbstractEventLoop):
        self._owner = owner
        self.loop = loop
        self.num_seqs = {r.request_id: r.params.n for r in requests}
        self.unfinished = set(self.num_seqs)
        self.last_tokens_at: dict[str, float] = {}  # request id -> when its previous tokens came out
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self.unfinished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        if item.finished:
            self._owner._release(self, item.request_id)
        return item

    def close(self) -> None:
        self._owner._close(self)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, max_queue: int | None = None) -> None:
        """max_queue: sequences that may wait beyond a full batch (max_num_seqs); None = no limit."""
        self.engine = engine  # the engine thread's alone once started
        self.max_queue = max_queue
        self.limits: RequestLimits = engine.limits
        self.config: EngineConfig = engine.config  # fixed at start: read it from any thread
        self.steps = StepFeed(engine)  # per-step records for the metrics and the tracer (engine thread)
        self._description = engine.describe()
        self._snapshot = engine.snapshot(with_block_states=True)
        self._block_states_at = time.monotonic()
        self.error: BaseException | None = None  # set when the engine thread gave up
        self._observers: list[OutputObserver] = []
        self._commands: deque[tuple] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._draining = False  # shutting down: no new requests, those in flight run on
        self._thread: threading.Thread | None = None
        self._streams: dict[str, RequestStream] = {}  # engine thread only
        self._admission = threading.Lock()
        self.num_seqs_in_flight = 0  # guarded by _admission

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "AsyncEngine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engine-step-loop", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the step loop, then the engine's worker processes; streams still open get EngineUnavailableError."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():  # the engine thread no longer touches it
            self.engine.close()

    def drain(self) -> None:
        """Admit nothing new (submit raises EngineUnavailableError); requests in flight run on."""
        self._draining = True

    def abort_all(self) -> None:
        """Abort every request in flight (between steps); each stream still ends with its "abort" output."""
        self._commands.append(("abort_all",))
        self._wake.set()

    def __enter__(self) -> "AsyncEngine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping and self.error is None

    def unavailable_error(self) -> EngineUnavailableError | None:
        """Why this engine takes no requests now, or None while it runs."""
        if self._draining:
            return EngineUnavailableError("the server is shutting down")
        if self.is_running:
            failure = self.engine.failure()  # e.g. a worker died while the engine sat idle
            return None if failure is None else EngineUnavailableError(f"the engine cannot run: {failure}")
        return EngineUnavailableError("the engine is not running" + (f": {self.error}" if self.error else ""))

    def add_observer(self, observer: OutputObserver) -> None:
        self._observers.append(observer)

    def remove_observer(self, observer: OutputObserver) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    # -- called by request handlers ------------------------------------------------------------

    def describe(self) -> dict[str, str]:
        """What runs (model, dtype, device, backend, scheduler, memory ledger ...), fixed at start."""
        return dict(self._description)

    def snapshot(self) -> EngineStats:
        """The engine's metrics as of its last step (a copy: read it anywhere)."""
        return self._snapshot

    def reset_stats(self) -> None:
        """Counters from zero, applied between steps."""
        self._commands.append(("reset_stats",))
        self._wake.set()
        if self._thread is None:  # not started: nothing else touches the engine
            self._apply_commands()
            self._publish()

    @property
    def capacity(self) -> int | None:
        """Most sequences in flight at once (running + waiting), or None for no limit."""
        return None if self.max_queue is None else self.engine.config.max_num_seqs + self.max_queue

    def admit(self, prompt_ids: list[int], params: SamplingParams) -> Admitted:
        """The request as the engine runs it; RequestError for what the engine would reject, or cut short
        because it can never fit the KV cache. Safe from any thread."""
        return self.limits.admit(prompt_ids, params, whole=True)

    def submit(self, requests: Sequence[EngineRequest]) -> RequestStream:
        """Enqueue a group of validated requests (all or none); call from a coroutine.

        Raises QueueFullError when admitting them would exceed the capacity, RequestError when
        they could never be admitted, EngineUnavailableError when the engine is not running.
        """
        unavailable = self.unavailable_error()
        if unavailable is not None:
            raise unavailable
        stream = RequestStream(self, requests, asyncio.get_running_loop())
        need = sum(stream.num_seqs.values())
        with self._admission:
            cap = self.capacity
            if cap is not None and need > cap:
                raise RequestError(f"the request needs {need} sequences but the server admits at most {cap} at once",
                                   code="too_many_sequences")
            if cap is not None and self.num_seqs_in_flight + need > cap:
                raise QueueFullError(f"the server is at capacity ({self.num_seqs_in_flight} sequences in flight, "
                                     f"limit {cap}); retry later")
            self.num_seqs_in_flight += need
        for r in requests:
            self._commands.append(("add", r, stream))
        self._wake.set()
        return stream

    async def between_steps(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) on the engine thread between two steps (embeddings); its result, or what it raised."""
        unavailable = self.unavailable_error()
        if unavailable is not None:
            raise unavailable
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.append(("call", fn, future))
        self._wake.set()
        return await future

    def abort(self, request_id: str) -> None:
        """Abort one request but keep its stream: the stream still ends with a finished output whose
        finish_reason is "abort" (what Stop in the chat wants). Safe from any thread; unknown ids are ignored."""
        self._commands.append(("abort", request_id))
        self._wake.set()

    def _release(self, stream: RequestStream, request_id: str) -> None:
        if request_id in stream.unfinished:
            stream.unfinished.discard(request_id)
            with self._admission:
                self.num_seqs_in_flight -= stream.num_seqs[request_id]

    def _close(self, stream: RequestStream) -> None:
        gone = list(stream.unfinished)
        for rid in gone:
            self._release(stream, rid)
            self._commands.append(("abort", rid))
        if gone:
            self._wake.set()

    # -- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping and self.error is None:
                self._wake.clear()
                self._apply_commands()
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._publish(idle=True)
                    self._wake.wait()
        except BaseException as exc:  # a bug in the loop itself: say so, fail everyone, stop
            log.exception("the engine thread failed")
            self.error = exc
        self._fail_all(EngineUnavailableError("the engine stopped" + (f": {self.error}" if self.error else "")))

    def _apply_commands(self) -> None:
        while self._commands:
            command = self._commands.popleft()
            if command[0] == "add":
                self._add(command[1], command[2])
            elif command[0] == "abort":
                self.engine.abort_request(command[1])
            elif command[0] == "call":
                run_call(self.engine, command[1], command[2])
            elif command[0] == "abort_all":
                for request_id in list(self._streams):
                    self.engine.abort_request(request_id)
            else:
                self.engine.reset_stats()

    def _add(self, request: EngineRequest, stream: RequestStream) -> None:
        try:
            self.engine.add(request.request_id, request.admitted, request.arrival)
        except Exception as exc:  # RequestError normally; anything else must not stop the loop either
            if not isinstance(exc, RequestError):
                log.exception("add_request failed")
            self._send(stream, exc)
            return
        self._streams[request.request_id] = stream

    def _step(self) -> None:
        self.steps.begin()
        try:
            outputs = self.engine.step()
        except EngineDeadError as exc:  # no step can run again: stop serving (503), do not retry
            self.error = exc
            return
        except Exception as exc:
            log.exception("engine step failed; failing the requests in flight")
            self._fail_all(EngineStepError(f"the engine failed while serving this request: {exc}"))
            return
        now = time.perf_counter()
        self._publish()
        self.steps.end(outputs)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = defaultdict(list)
        for out in outputs:
            stream = self._streams.pop(out.request_id) if out.finished else self._streams.get(out.request_id)
            if stream is not None:
                by_loop[stream.loop].append((stream, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._hand_over, items, now)
            except RuntimeError:  # that event loop is closed: nobody will read these, stop them
                for stream, out in items:
                    self._streams.pop(out.request_id, None)
                    self._release(stream, out.request_id)  # nobody will close the stream to free its seats
                    self.engine.abort_request(out.request_id)

    def _publish(self, idle: bool = False) -> None:
        """A fresh snapshot; while busy the block states are copied at most every BLOCK_STATES_EVERY s."""
        now = time.monotonic()
        fresh_blocks = idle or now - self._block_states_at >= BLOCK_STATES_EVERY
        snapshot = self.engine.snapshot(with_block_states=fresh_blocks)
        if fresh_blocks:
            self._block_states_at = now
        else:
            snapshot.block_states = self._snapshot.block_states
        self._snapshot = snapshot

    def _hand_over(self, items: list[tuple[RequestStream, RequestOutput]], now: float) -> None:
        """On the event loop: queue each output on its stream, then let observers see it."""
        for stream, out in items:
            stream.put(out)
            gap = None
            if any(c.delta_token_ids for c in out.outputs):
                last = stream.last_tokens_at.get(out.request_id)
                gap = None if last is None else now - last
                stream.last_tokens_at[out.request_id] = now
            for observer in self._observers:
                try:
                    observer.on_output(out, now, gap)
                except Exception:  # metrics must never break serving
                    log.exception("output observer failed")

    def _send(self, stream: RequestStream, item: BaseException) -> None:
        try:
            stream.loop.call_soon_threadsafe(stream.put, item)
        except RuntimeError:
            pass

    def _fail_all(self, exc: BaseException) -> None:
        """Every stream in flight gets exc; its requests leave the engine (best effort)."""
        for rid, stream in list(self._streams.items()):
            self._send(stream, exc)
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
        self._streams.clear()
        while self._commands:
            command = self._commands.popleft()
            if command[0] == "add":
                self._send(command[2], exc)
            elif command[0] == "call":
                run_call(self.engine, command[1], command[2], exc)
        try:
            if self.engine.has_unfinished_requests():
                self.engine.step()  # emits the aborts and frees their blocks
        except Exception:
            log.exception("the engine could not flush aborted requests")
            self.error = self.error or exc
        self._publish(idle=True)
