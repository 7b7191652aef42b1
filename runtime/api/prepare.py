"""Turn a parsed request into validated, tokenized EngineRequests (run in the handler thread pool).

Chat templating, encoding and every check the engine would make happen here, before anything is
enqueued: a bad request is an immediate 400 and never reaches the engine thread.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.api.errors import APIError
from runtime.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from runtime.api.sampling import requested_logprobs, sampling_params
from runtime.async_engine import AsyncEngine, EngineRequest
from runtime.request_limits import RequestLimits
from runtime.errors import RequestError


@dataclass
class PreparedPrompt:
    request: EngineRequest
    echo: str  # text to put before the completion when echo is asked for ("" otherwise)


def completion_prompts(req: CompletionRequest, limits: RequestLimits) -> list[tuple[list[int], str]]:
    """(token ids, prompt text) per prompt: a string, a token list, or a batch of either."""
    p = req.prompt
    if isinstance(p, str):
        return [(limits.encode_text(p), p)]
    if p and isinstance(p[0], int):
        return [(list(p), "")]
    return [(limits.encode_text(x), x) if isinstance(x, str) else (list(x), "") for x in p]


def chat_prompt(req: ChatCompletionRequest, limits: RequestLimits) -> list[int]:
    return limits.encode_chat([m.template_dict() for m in req.messages])


def prepare(engine: AsyncEngine, req: SamplingFields, request_id: str, arrival: float) -> list[PreparedPrompt]:
    """One EngineRequest per prompt (ids request_id-0, -1, ...); raises APIError / RequestError."""
    limits = engine.limits
    logprobs = requested_logprobs(req)
    try:
        prompts = _encoded_prompts(req, limits, logprobs)
        out = []
        for i, (ids, text) in enumerate(prompts):
            params = sampling_params(req, len(ids), limits.max_request_tokens, logprobs)
            engine.check(ids, params)
            echo = (text or limits.tokenizer.decode(ids)) if isinstance(req, CompletionRequest) and req.echo else ""
            out.append(PreparedPrompt(EngineRequest(f"{request_id}-{i}", ids, params, arrival), echo))
    except RequestError as exc:
        if exc.param is not None:  # a sampling parameter: as_api_error names it
            raise
        raise APIError(400, str(exc), "messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                       exc.code or "invalid_prompt") from None
    return out


def _encoded_prompts(req: SamplingFields, limits: RequestLimits, logprobs: int | None) -> list[tuple[list[int], str]]:
    if isinstance(req, ChatCompletionRequest):
        return [(chat_prompt(req, limits), "")]
    assert isinstance(req, CompletionRequest)
    if req.echo and logprobs is not None:
        raise APIError(400, "echo together with logprobs is not supported (no prompt logprobs)", "echo")
    return completion_prompts(req, limits)

