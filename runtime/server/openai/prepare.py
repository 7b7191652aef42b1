"""From a parsed OpenAI request to validated, tokenized EngineRequests, submitted to the engine.

Chat templating, encoding and every check the engine would make happen here, before anything is
enqueued: a bad request is an immediate 400 and never reaches the engine thread.
"""
from __future__ import annotations

import re
import time
import uuid
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from runtime.errors import RequestError
from runtime.request_limits import RequestLimits
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import AsyncEngine, EngineRequest, RequestStream
from runtime.server.errors import APIError
from runtime.server.openai.generation import Generation, PreparedPrompt
from runtime.server.openai.protocol import TOKEN_ID_KEY, ChatCompletionRequest, CompletionRequest, SamplingFields
from runtime.server.openai.reasoning import PARSERS as REASONING_PARSERS
from runtime.server.openai.reasoning import ReasoningParser
from runtime.server.openai.response_format import structured_output
from runtime.server.openai.tools import ToolPlan, chat_messages, tool_plan, tool_structure
from runtime.server.state import ServerState
from structured.limits import GrammarLimits
from structured.spec import StructuredOutput


def completion_prompts(req: CompletionRequest, limits: RequestLimits) -> list[tuple[list[int], str]]:
    """(token ids, prompt text) per prompt: a string, a token list, or a batch of either."""
    p = req.prompt
    if isinstance(p, str):
        return [(limits.encode_text(p), p)]
    if p and isinstance(p[0], int):
        return [(list(p), "")]
    return [(limits.encode_text(x), x) if isinstance(x, str) else (list(x), "") for x in p]


def chat_prompt(req: ChatCompletionRequest, limits: RequestLimits, plan: ToolPlan | None = None) -> list[int]:
    messages, variables = chat_messages(req, plan, limits.tokenizer.chat_template)
    return limits.encode_chat(messages, req.chat_options(), **variables)


def prepare(engine: AsyncEngine, req: SamplingFields, request_id: str, arrival: float,
            plan: ToolPlan | None = None, default_max_tokens: int = 0,
            model_defaults: dict[str, Any] | None = None,
            structure: StructuredOutput | None = None) -> list[PreparedPrompt]:
    """One EngineRequest per prompt (ids request_id-0, -1, ...); raises APIError / RequestError.
    default_max_tokens: the cap on a request without max_tokens (0: none but the context);
    model_defaults: the model's sampling defaults (generation_config.json) for fields the request omits;
    structure: the request's grammar (request_structure), compiled beforehand."""
    limits = engine.limits
    logprobs = requested_logprobs(req)
    try:
        prompts = _encoded_prompts(req, limits, logprobs, plan)
        out = []
        for i, (ids, text) in enumerate(prompts):
            room = limits.max_request_tokens - len(ids)
            params = sampling_params(req, default_tokens(room, default_max_tokens), logprobs, model_defaults,
                                     structure)
            admitted = engine.admit(ids, params)
            echo = (text or limits.tokenizer.decode(ids)) if isinstance(req, CompletionRequest) and req.echo else ""
            out.append(PreparedPrompt(EngineRequest(f"{request_id}-{i}", admitted, arrival), echo))
    except RequestError as exc:
        if exc.param is not None:  # a sampling parameter: as_api_error names it
            raise
        raise APIError(400, str(exc), "messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                       exc.code or "invalid_prompt") from None
    return out


def _encoded_prompts(req: SamplingFields, limits: RequestLimits, logprobs: int | None,
                     plan: ToolPlan | None) -> list[tuple[list[int], str]]:
    if isinstance(req, ChatCompletionRequest):
        return [(chat_prompt(req, limits, plan), "")]
    assert isinstance(req, CompletionRequest)
    if req.echo and logprobs is not None:
        raise APIError(400, "echo together with logprobs is not supported (no prompt logprobs)", "echo",
                       "invalid_value")
    return completion_prompts(req, limits)


async def start_generation(state: ServerState, req: SamplingFields, prefix: str,
                           request: Request | None = None) -> tuple[Generation, RequestStream]:
    """Check the model, compile the grammar (cancelled if the client leaves), tokenize and validate in
    the thread pool, then enqueue (all or nothing)."""
    arrival = time.perf_counter()
    state.check_model(req.model)
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    plan = tool_plan(req, state.options.tool_call_parser) if isinstance(req, ChatCompletionRequest) else None
    structure = request_structure(req, plan, state.compiles.service.limits)
    unavailable = state.engine.unavailable_error()
    if structure is not None and unavailable is not None:  # shutting down: no compile starts now
        raise unavailable
    unenforced = await state.compiles.compile(structure, request) if structure is not None else []
    prompts = await run_in_threadpool(prepare, state.engine, req, response_id, arrival, plan,
                                      state.options.default_max_tokens, state.options.sampling_defaults, structure)
    wants_logprobs = prompts[0].request.params.logprobs is not None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    gen = Generation(response_id, int(time.time()), state.model_name, req.n, prompts, wants_logprobs, include_usage,
                     state.formatter, plan, reasoning_parser(state, req, prompts),
                     structure.param if structure else None, unenforced)
    stream = state.engine.submit([p.request for p in prompts])
    observe(state, gen, req)
    return gen, stream


def observe(state: ServerState, gen: Generation, req: SamplingFields) -> None:
    """A submitted generation for /metrics (its grammar's compile time) and the access log and traces."""
    for p in gen.prompts:
        if p.request.admitted.grammar is not None:
            state.metrics.observe_grammar(p.request.admitted.grammar.seconds)
    telemetry = state.telemetry
    if telemetry is not None:
        prompt = None
        if telemetry.log_prompts:  # the request's own text, as sent
            prompt = req.prompt if isinstance(req, CompletionRequest) else [m.model_dump(exclude_none=True)
                                                                              for m in req.messages]
        telemetry.watch(gen.response_id, gen.model, [p.request for p in gen.prompts], prompt)


def reasoning_parser(state: ServerState, req: SamplingFields, prompts: list[PreparedPrompt]) -> ReasoningParser | None:
    """The server's reasoning parser for a chat request whose output no grammar shapes."""
    name = state.options.reasoning_parser
    free = prompts[0].request.params.structured is None
    return REASONING_PARSERS[name] if name and free and isinstance(req, ChatCompletionRequest) else None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    """JSON object keys are strings: each must spell a token id (its range is SamplingParams' check)."""
    out = {}
    for key, value in (bias or {}).items():
        if not re.fullmatch(TOKEN_ID_KEY, key):
            raise APIError(400, f"invalid 'logit_bias': key {key!r} is not a token id", "logit_bias", "invalid_value")
        out[int(key)] = value
    return out


SEED_MODULUS = 2**63  # the engine seeds generators with (seed + choice index) mod 2**63: the same draws


def default_tokens(room: int, cap: int) -> int:
    """max_tokens for a request that names none: the room left in the context and the KV cache, at
    most cap (0: no cap, as vLLM). At least 1, so a prompt filling the room fails the engine's check
    with both numbers named, not 'max_tokens 0'."""
    return max(1, min(room, cap) if cap > 0 else room)


def sampling_params(req: SamplingFields, default_max_tokens: int, logprobs: int | None,
                    model_defaults: dict[str, Any] | None = None,
                    structure: StructuredOutput | None = None) -> SamplingParams:
    """model_defaults: {SamplingParams field: value} for the fields the request does not set (its
    max_tokens: a cap on default_max_tokens); structure: its grammar (request_structure)."""
    if isinstance(req, ChatCompletionRequest):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    else:
        max_tokens = req.max_tokens
    unset = {k: v for k, v in (model_defaults or {}).items() if k not in req.model_fields_set}
    if max_tokens is None:
        max_tokens = min(default_max_tokens, unset.get("max_tokens", default_max_tokens))
    transfer = req.kv_transfer_params.model_dump(exclude_none=True) if req.kv_transfer_params else None
    if transfer and transfer["do_remote_decode"]:
        max_tokens = 1  # a prefill for another instance: the prompt's KV and one token, as vLLM's protocol runs it
    knob = {name: unset.get(name, getattr(req, name))
            for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    return SamplingParams(
        n=req.n, max_tokens=max_tokens, min_tokens=req.min_tokens, **knob, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, seed=None if req.seed is None else req.seed % SEED_MODULUS,
        stop=req.stop if req.stop is not None else [],
        stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, logprobs=logprobs,
        logit_bias=_logit_bias(req.logit_bias), skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output, structured=structure,
        kv_transfer_params=transfer)


def request_structure(req: SamplingFields, plan: ToolPlan | None, limits: GrammarLimits) -> StructuredOutput | None:
    """The request's grammar: response_format / guided_*, or the one tool_choice enforces (not both);
    its size checked against limits before anything else reads it whole."""
    asked, tools = structured_output(req, limits), tool_structure(req, plan, limits) if plan is not None else None
    if asked is not None and tools is not None:
        raise APIError(400, f"tool_choice '{plan.mode}' cannot be combined with {asked.param}", "tool_choice",
                       "invalid_value")
    return asked or tools


def requested_logprobs(req: SamplingFields) -> int | None:
    """How many top logprobs per token the request wants (None: no logprobs at all)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    assert isinstance(req, ChatCompletionRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "invalid 'top_logprobs': it needs 'logprobs': true", "top_logprobs", "invalid_value")
    return (req.top_logprobs or 0) if req.logprobs else None
