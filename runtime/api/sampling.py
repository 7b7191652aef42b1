"""From an OpenAI request's knobs to SamplingParams for one prompt."""
from __future__ import annotations

import re

from runtime.api.errors import APIError
from runtime.api.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from runtime.sampling_params import SamplingParams


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    out = {}
    for key, value in (bias or {}).items():
        if not re.fullmatch(r"[0-9]{1,10}", key):
            raise APIError(400, f"invalid 'logit_bias': key {key!r} is not a token id", "logit_bias", "invalid_value")
        out[int(key)] = value
    return out


def _stop(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if any(not s for s in stops):
        raise APIError(400, "invalid 'stop': stop strings must be non-empty", "stop", "invalid_value")
    return stops


def default_max_tokens(prompt_len: int, max_request_tokens: int) -> int:
    """Like vLLM: the rest of the context (of the KV cache too, under static batching). At least 1,
    so a prompt filling it fails the engine's check with both numbers named, not 'max_tokens 0'."""
    return max(1, max_request_tokens - prompt_len)


def sampling_params(req: SamplingFields, prompt_len: int, max_request_tokens: int,
                    logprobs: int | None) -> SamplingParams:
    if isinstance(req, ChatCompletionRequest):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    else:
        max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = default_max_tokens(prompt_len, max_request_tokens)
    return SamplingParams(
        n=req.n, max_tokens=max_tokens,
        min_tokens=req.min_tokens, temperature=req.temperature, top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p, repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty, seed=req.seed, stop=_stop(req.stop),
        stop_token_ids=list(req.stop_token_ids or []), ignore_eos=req.ignore_eos, logprobs=logprobs,
        logit_bias=_logit_bias(req.logit_bias), skip_special_tokens=req.skip_special_tokens)


def requested_logprobs(req: SamplingFields) -> int | None:
    """How many top logprobs per token the request wants (None: no logprobs at all)."""
    if isinstance(req, CompletionRequest):
        return req.logprobs
    assert isinstance(req, ChatCompletionRequest)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "invalid 'top_logprobs': it needs 'logprobs': true", "top_logprobs", "invalid_value")
    return (req.top_logprobs or 0) if req.logprobs else None
