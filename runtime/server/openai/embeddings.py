"""POST /v1/embeddings (OpenAI's shape): a string, a list of strings, token ids or a list of them ->
one unit-length vector each, from the model's final hidden states (runtime/model/pooling.py; the
pooling is --embedding-pooling). They run on the engine thread between two generation steps, in
scratch KV blocks: generation's cache is untouched."""
from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from runtime.engine import LLMEngine
from runtime.errors import RequestError
from runtime.request_limits import RequestLimits
from runtime.server.errors import ERROR_RESPONSES, APIError
from runtime.server.openai.leniency import check_fields
from runtime.server.openai.pooling import embed
from runtime.server.openai.protocol import Int, Prompt, Str
from runtime.server.openai.sse import with_ignored
from runtime.server.state import ServerState, server_state

router = APIRouter()
RESPONSES = {k: v for k, v in ERROR_RESPONSES.items() if k in (400, 401, 404, 413, 503)}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"input": "The food was delicious"}, {"input": ["first text", "second text"], "encoding_format": "base64"}]})
    model: Str | None = None
    input: Prompt = Field(description="a string, a list of token ids, or a batch: a list of either")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    dimensions: Annotated[Int(1), Field(json_schema_extra={"x-embedding-size": True})] | None = Field(
        None, description="only the model's hidden size is supported")
    user: Str | None = None


def _prompts(req: EmbeddingRequest, limits: RequestLimits) -> list[list[int]]:
    x = req.input
    items = [x] if isinstance(x, str) or isinstance(x[0], int) else x
    try:
        prompts = [limits.encode_text(p) if isinstance(p, str) else list(p) for p in items]
    except RequestError as exc:  # a text too long for the context
        raise APIError(400, str(exc), "input", exc.code) from None
    for i, ids in enumerate(prompts):
        if len(ids) > limits.max_model_len:
            raise APIError(400, f"input {i} has {len(ids)} tokens; the model takes at most {limits.max_model_len}",
                           "input", "context_length_exceeded")
        if any(t >= limits.vocab_size for t in ids):
            raise APIError(400, f"input {i} has a token id outside [0, {limits.vocab_size})", "input", "invalid_value")
    return prompts


def _vectors(engine: LLMEngine, prompts: list[list[int]], dimensions: int | None, pooling: str) -> list[list[float]]:
    """On the engine thread: one vector per prompt (as lists, so no tensor leaves the thread)."""
    hidden = engine.model_config.hidden_size
    if dimensions is not None and dimensions != hidden:
        raise APIError(400, f"dimensions {dimensions} is not supported: this model's embeddings have {hidden}",
                       "dimensions", "invalid_value")
    if engine.runner.describe().get("tensor parallel", "off") != "off":
        raise APIError(400, "embeddings are not served under tensor parallelism", "input", "unsupported")
    batch_tokens = max(engine.config.max_num_batched_tokens, max(map(len, prompts)))
    return [v.tolist() for v in embed(engine.model_runner, prompts, pooling, max_batch_tokens=batch_tokens)]


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


@router.post("/v1/embeddings", responses=RESPONSES)
async def create_embeddings(body: EmbeddingRequest, state: ServerState = Depends(server_state)) -> JSONResponse:
    ignored = check_fields(body, state.options.strict_api)
    state.check_model(body.model)
    prompts = await run_in_threadpool(_prompts, body, state.engine.limits)
    pooling = state.options.embedding_pooling
    vectors = await state.engine.between_steps(lambda engine: _vectors(engine, prompts, body.dimensions, pooling))
    tokens = sum(map(len, prompts))
    payload: dict[str, Any] = {
        "object": "list", "model": state.model_name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "data": [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                 for i, v in enumerate(vectors)]}
    return with_ignored(JSONResponse(payload), ignored)
