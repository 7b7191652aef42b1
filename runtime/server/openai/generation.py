"""What both generation routes share: the Generation record, and answering with one JSON body,
aborting the engine requests if the client leaves (SSE answers: runtime.server.openai.sse).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from runtime.outputs import CompletionOutput, RequestOutput
from runtime.server.async_engine import AsyncEngine, EngineRequest, RequestStream
from runtime.server.errors import APIError
from runtime.server.openai.logprobs import LogprobFormatter
from runtime.server.openai.reasoning import ReasoningParser
from runtime.server.openai.tools import ToolPlan
from structured.processor import GrammarStop

CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; nobody is left to read it


@dataclass
class PreparedPrompt:
    request: EngineRequest
    echo: str  # text to put before the completion when echo is asked for ("" otherwise)


@dataclass
class Generation:
    """One HTTP request's engine requests and the bookkeeping its responses need."""

    response_id: str
    created: int
    model: str
    n: int
    prompts: list[PreparedPrompt]
    logprobs: bool
    include_usage: bool
    formatter: LogprobFormatter
    tools: ToolPlan | None = None  # a chat request's tool calling, when it offers tools
    reasoning: ReasoningParser | None = None  # a chat request's thinking split from its answer
    grammar_param: str | None = None  # the field of the request's grammar, when it has one
    unenforced: list[str] = field(default_factory=list)  # its schema keywords ignored (strict: false)
    prompt_index: dict[str, int] = field(init=False)  # engine request id -> prompt number

    def __post_init__(self) -> None:
        self.prompt_index = {p.request.request_id: i for i, p in enumerate(self.prompts)}

    def choice_index(self, request_id: str, index: int) -> int:
        """OpenAI's batch semantics: choices of prompt i are i*n .. i*n+n-1."""
        return self.prompt_index[request_id] * self.n + index

    def usage(self, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
        """OpenAI's usage; cached_tokens: prompt tokens whose KV came from the prefix cache."""
        prompt = sum(len(p.request.prompt_ids) for p in self.prompts)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect(request: Request, stream: RequestStream) -> dict[str, RequestOutput] | None:
    """Every request's final output, or None if the client disconnected first (requests aborted)."""
    finals: dict[str, RequestOutput] = {}

    async def drain() -> None:
        async for out in stream:
            if out.finished:
                finals[out.request_id] = out

    work = asyncio.ensure_future(drain())
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            return None
        work.result()  # re-raise an engine failure
        return finals
    finally:
        work.cancel()
        watch.cancel()
        stream.close()


def transfer_fields(outputs: Iterable[RequestOutput]) -> dict[str, Any]:
    """A prefill's kv_transfer_params (where the prompt's KV waits for a decode instance), when it has them."""
    params = next((p for out in outputs if (p := out.metrics.get("kv_transfer_params")) is not None), None)
    return {} if params is None else {"kv_transfer_params": params}


def finish_fields(c: CompletionOutput, finish_reason: str | None = None) -> dict[str, Any]:
    """A choice's finish_reason (OpenAI's values only) and stop_reason; a grammar's own reason for
    ending it (complete under ignore_eos, or allowing no token) goes in finish_details."""
    if isinstance(c.stop_reason, GrammarStop):
        return {"finish_reason": finish_reason or c.finish_reason, "stop_reason": None,
                "finish_details": {"type": "grammar", "reason": str(c.stop_reason)}}
    return {"finish_reason": finish_reason or c.finish_reason, "stop_reason": c.stop_reason}


def grammar_failure(gen: Generation, outputs: Iterable[RequestOutput]) -> APIError | None:
    """The error for a request whose grammar gave up (its masks too slow: finish_reason "error")."""
    why = next((c.stop_reason for out in outputs for c in out.outputs if c.finish_reason == "error"), None)
    if why is None:
        return None
    return APIError(400, f"the request was stopped: {why}", gen.grammar_param, "grammar_too_slow")


def aborted_error(engine: AsyncEngine) -> APIError:
    """What a client still there hears when the server aborted its request (it is shutting down)."""
    why = engine.unavailable_error()
    return APIError(503, "the request was aborted by the server" + (f": {why}" if why else ""), code="aborted")


async def json_response(request: Request, stream: RequestStream, engine: AsyncEngine, gen: Generation,
                        body: Callable[[dict[str, RequestOutput]], dict[str, Any]]) -> Response:
    """Wait for every final output, then answer with body(finals); abort if the client leaves first."""
    finals = await collect(request, stream)
    if finals is None:
        return Response(status_code=CLIENT_CLOSED)
    if any(c.finish_reason == "abort" for out in finals.values() for c in out.outputs):
        # aborted by the server, not by this client (which is still here): no answer to give
        raise aborted_error(engine)
    failure = grammar_failure(gen, finals.values())
    if failure is not None:
        raise failure
    return JSONResponse(body(finals))
