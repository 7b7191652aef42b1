"""Server-sent events for streaming responses: chunk rendering, the event stream, and its cleanup;
and `answer`, which both generation routes end with (SSE events or one JSON body)."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator, Callable, Iterable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from runtime.outputs import CompletionOutput, RequestOutput
from runtime.server.async_engine import AsyncEngine, RequestStream
from runtime.server.errors import APIError, as_api_error, error_body
from runtime.server.openai.generation import Generation, aborted_error, grammar_failure, json_response
from runtime.server.openai.leniency import IGNORED_HEADER, header_value
from runtime.server.openai.protocol import SamplingFields
from runtime.server.state import ServerState

DONE = "data: [DONE]\n\n"
UNENFORCED_HEADER = "X-Unenforced-Schema-Keywords"  # what a best-effort (strict: false) schema had ignored


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ChunkRenderer:
    """Turns engine outputs into SSE payloads; subclasses say what a chunk looks like.

    Each choice gets its delta chunks, then one final chunk with its finish_reason and an empty
    delta; with include_usage, a last chunk with no choices carries the usage.
    """

    chunk_object = ""  # the "object" of every chunk

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.finished: set[int] = set()
        self.aborted = False  # a choice ended with "abort": the server stopped it (shutting down)
        self.failed: APIError | None = None  # a choice's grammar gave up: an error event ends the stream
        self.completion_tokens = 0
        self.cached_tokens: dict[str, int] = {}  # engine request id -> its prompt tokens from the prefix cache

    def start(self) -> Iterable[dict[str, Any]]:
        return ()

    def delta(self, index: int, c: CompletionOutput) -> dict[str, Any] | None:
        raise NotImplementedError

    def final(self, index: int, c: CompletionOutput) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        g = self.gen
        out = {"id": g.response_id, "object": self.chunk_object, "created": g.created, "model": g.model,
               "choices": choices}
        if g.include_usage:
            out["usage"] = usage
        return out

    def output(self, out: RequestOutput) -> Iterable[dict[str, Any]]:
        self.cached_tokens[out.request_id] = out.num_cached_tokens
        for c in out.outputs:
            index = self.gen.choice_index(out.request_id, c.index)
            if index in self.finished:
                continue
            yield from _chunks(self.delta(index, c))
            if c.finish_reason is not None:
                self.finished.add(index)
                self.aborted = self.aborted or c.finish_reason == "abort"
                self.completion_tokens += len(c.token_ids)
                if c.finish_reason == "error":  # no finish_reason but OpenAI's: the error event says why
                    self.failed = self.failed or grammar_failure(self.gen, [out])
                    continue
                yield from _chunks(self.final(index, c))

    def end(self) -> Iterable[dict[str, Any]]:
        if self.gen.include_usage:
            yield self.chunk([], self.gen.usage(self.completion_tokens, sum(self.cached_tokens.values())))


def _chunks(body: dict[str, Any] | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """delta and final give one chunk, several (tool calls), or None."""
    return [] if body is None else body if isinstance(body, list) else [body]


def error_event(err: APIError) -> str:
    return event(error_body(err.status, err.message, err.param, err.code))


async def sse_events(stream: RequestStream, renderer: ChunkRenderer, engine: AsyncEngine) -> AsyncIterator[str]:
    """The event stream; an engine failure becomes an error event, and so does an abort by the
    server (after each choice's final "abort" chunk). Always closes the stream."""
    try:
        for payload in renderer.start():
            yield event(payload)
        async for out in stream:
            for payload in renderer.output(out):
                yield event(payload)
        for payload in renderer.end():
            yield event(payload)
        if renderer.aborted or renderer.failed:
            yield error_event(renderer.failed or aborted_error(engine))
        yield DONE
    except Exception as exc:  # not CancelledError / GeneratorExit: those mean the client is gone
        yield error_event(as_api_error(exc))
        yield DONE
    finally:
        stream.close()


def sse_response(stream: RequestStream, renderer: ChunkRenderer, engine: AsyncEngine) -> StreamingResponse:
    # The background task closes the stream even if the body iterator is abandoned without being
    # closed (Starlette cancels the send loop on disconnect): close() is idempotent.
    return StreamingResponse(sse_events(stream, renderer, engine), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(stream.close))


async def respond(state: ServerState, body: SamplingFields, request: Request, gen: Generation, stream: RequestStream,
                  renderer: Callable[[Generation], ChunkRenderer],
                  json_body: Callable[[Generation, dict[str, RequestOutput]], dict[str, Any]]) -> Response:
    """A started generation's answer: renderer(gen)'s events streamed, or json_body(gen, finals)."""
    if body.stream:
        response: Response = sse_response(stream, renderer(gen), state.engine)
    else:
        response = await json_response(request, stream, state.engine, gen, lambda finals: json_body(gen, finals))
    if gen.unenforced:
        response.headers[UNENFORCED_HEADER] = header_value(gen.unenforced, safe="._-[]/~$ ")  # "allOf at /a/b"
    return response


def with_ignored(response: Response, ignored: list[str]) -> Response:
    """The response, naming the request fields this server ignored (leniency.check_fields)."""
    if ignored:
        response.headers[IGNORED_HEADER] = header_value(ignored)
    return response
