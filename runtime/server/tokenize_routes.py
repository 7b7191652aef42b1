"""POST /tokenize and /detokenize, in vLLM's shapes: a prompt or chat messages -> token ids (and the
context length), token ids -> text. Under --api-key like every route but /health."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from runtime.request_limits import RequestLimits
from runtime.server.errors import ERROR_RESPONSES, APIError
from runtime.server.openai.leniency import IGNORED_HEADER, check_fields, header_value
from runtime.server.openai.protocol import Bool, ChatMessage, ChatTemplateFields, Str, TokenId
from runtime.server.state import ServerState, server_state

router = APIRouter()
RESPONSES = {k: v for k, v in ERROR_RESPONSES.items() if k in (400, 401, 404, 413)}


class TokenizeRequest(ChatTemplateFields):
    """Either `prompt` (text) or `messages` (rendered through the chat template first)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"prompt": "Hello world"}, {"messages": [{"role": "user", "content": "Hi!"}]}]})
    model: Str | None = None
    prompt: Str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: Bool | None = Field(None, description="add BOS etc. (default: true for a prompt, false "
                                            "for messages, whose template writes them)")
    return_token_strs: Bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{"tokens": [1, 2, 3]}]})
    model: Str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str


def tokenize_ids(req: TokenizeRequest, limits: RequestLimits) -> list[int]:
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of 'prompt' and 'messages'", "prompt", "invalid_value")
    if req.prompt is not None:
        return limits.encode_text(req.prompt, add_special_tokens=req.add_special_tokens is not False)
    messages = [m.template_dict() for m in req.messages]
    return limits.encode_chat(messages, req.chat_options(), add_special_tokens=bool(req.add_special_tokens))


def _answer(payload: dict[str, Any], ignored: list[str]) -> JSONResponse:
    response = JSONResponse(payload)
    if ignored:
        response.headers[IGNORED_HEADER] = header_value(ignored)
    return response


@router.post("/tokenize", response_model=TokenizeResponse, responses=RESPONSES)
async def tokenize(body: TokenizeRequest, state: ServerState = Depends(server_state)) -> JSONResponse:
    ignored = check_fields(body, state.options.strict_api)
    state.check_model(body.model)
    limits = state.engine.limits
    ids = await run_in_threadpool(tokenize_ids, body, limits)
    out: dict[str, Any] = {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = [limits.tokenizer.id_to_token(i) or "" for i in ids]
    return _answer(out, ignored)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=RESPONSES)
async def detokenize(body: DetokenizeRequest, state: ServerState = Depends(server_state)) -> JSONResponse:
    ignored = check_fields(body, state.options.strict_api)
    state.check_model(body.model)
    limits = state.engine.limits
    bad = next((t for t in body.tokens if t >= limits.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is not in [0, {limits.vocab_size})", "tokens", "invalid_value")
    text = await run_in_threadpool(limits.tokenizer.decode, body.tokens)
    return _answer({"prompt": text}, ignored)
