"""POST /v1/completions: a prompt (string, token ids, or a batch of either) -> text, streamed or not."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from runtime.outputs import CompletionOutput, RequestOutput
from runtime.server.openai.generation import Generation, PreparedPrompt, finish_fields, transfer_fields
from runtime.server.openai.leniency import check_fields
from runtime.server.openai.logprobs import TextOffsets
from runtime.server.openai.prepare import start_generation
from runtime.server.openai.protocol import CompletionChunk, CompletionRequest, CompletionResponse
from runtime.server.openai.sse import ChunkRenderer, respond, with_ignored
from runtime.server.openapi import generation_responses
from runtime.server.state import ServerState, server_state

router = APIRouter()
RESPONSES = generation_responses(CompletionChunk, 'data: {"object":"text_completion","choices":[...]}\n\ndata: [DONE]\n\n')


def _logprobs(gen: Generation, token_ids: list[int], records: list | None, offsets: TextOffsets) -> dict[str, Any] | None:
    return gen.formatter.completion(token_ids, records, offsets) if gen.logprobs and records is not None else None


def _offsets(gen: Generation, prompt: PreparedPrompt) -> TextOffsets:
    return gen.formatter.offsets(len(prompt.echo), prompt.request.params.skip_special_tokens)


def completion_body(gen: Generation, finals: dict[str, RequestOutput]) -> dict[str, Any]:
    choices, generated = [], 0
    for p in gen.prompts:
        out = finals[p.request.request_id]
        for c in out.outputs:
            generated += len(c.token_ids)
            choices.append({"index": gen.choice_index(out.request_id, c.index), "text": p.echo + c.text,
                            "logprobs": _logprobs(gen, c.token_ids, c.logprobs, _offsets(gen, p)),
                            **finish_fields(c)})
    choices.sort(key=lambda ch: ch["index"])
    return {"id": gen.response_id, "object": "text_completion", "created": gen.created, "model": gen.model,
            "choices": choices, "usage": gen.usage(generated, sum(out.num_cached_tokens for out in finals.values())),
            **transfer_fields(finals.values())}


class CompletionChunks(ChunkRenderer):
    chunk_object = "text_completion"

    def __init__(self, gen: Generation) -> None:
        super().__init__(gen)
        self.offsets: dict[int, TextOffsets] = {}  # choice -> where its next token starts (for logprobs)

    def _chunk(self, index: int, text: str, logprobs=None, finish: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.chunk([{"index": index, "text": text, "logprobs": logprobs,
                            **(finish or {"finish_reason": None, "stop_reason": None})}])

    def start(self):
        for i, p in enumerate(self.gen.prompts):
            self.offsets.update({i * self.gen.n + k: _offsets(self.gen, p) for k in range(self.gen.n)})
            if p.echo:
                yield from (self._chunk(i * self.gen.n + k, p.echo) for k in range(self.gen.n))

    def delta(self, index: int, c: CompletionOutput):
        lp = _logprobs(self.gen, c.delta_token_ids, c.delta_logprobs, self.offsets[index])
        if not c.delta_text and not (lp and lp["tokens"]):
            return None
        return self._chunk(index, c.delta_text, lp)

    def final(self, index: int, c: CompletionOutput):
        return self._chunk(index, "", None, finish_fields(c))


@router.post("/v1/completions", response_model=CompletionResponse, responses=RESPONSES)
async def create_completion(body: CompletionRequest, request: Request,
                            state: ServerState = Depends(server_state)) -> Response:
    ignored = check_fields(body, state.options.strict_api)
    gen, stream = await start_generation(state, body, "cmpl", request)
    return with_ignored(await respond(state, body, request, gen, stream, CompletionChunks, completion_body), ignored)
