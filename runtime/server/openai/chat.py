"""POST /v1/chat/completions: messages through the model's chat template -> an assistant message."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from runtime.outputs import CompletionOutput, RequestOutput
from runtime.server.openai.generation import Generation, finish_fields, transfer_fields
from runtime.server.openai.leniency import check_fields
from runtime.server.openai.prepare import start_generation
from runtime.server.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from runtime.server.openai.reasoning import ReasoningSplitter, split_reasoning
from runtime.server.openai.sse import ChunkRenderer, respond, with_ignored
from runtime.server.openai.tool_output import ToolDeltas, chat_message
from runtime.server.openapi import generation_responses
from runtime.server.state import ServerState, server_state

router = APIRouter()
RESPONSES = generation_responses(ChatCompletionChunk,
                                 'data: {"object":"chat.completion.chunk","choices":[...]}\n\ndata: [DONE]\n\n')


def _logprobs(gen: Generation, token_ids: list[int], records: list | None) -> dict[str, Any] | None:
    return gen.formatter.chat(token_ids, records) if gen.logprobs and records is not None else None


def assistant_message(gen: Generation, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """(message, finish reason): tool calls are read from the answer, never from the thinking."""
    if gen.reasoning is None:
        return chat_message(gen.tools, text, finish_reason)
    reasoning, content = split_reasoning(gen.reasoning, text)
    message, finish_reason = chat_message(gen.tools, content or "", finish_reason)
    return {**message, "content": message["content"] or None, "reasoning_content": reasoning}, finish_reason


def chat_body(gen: Generation, finals: dict[str, RequestOutput]) -> dict[str, Any]:
    out = finals[gen.prompts[0].request.request_id]
    choices = []
    for c in out.outputs:
        message, finish_reason = assistant_message(gen, c.text, c.finish_reason)
        choices.append({"index": c.index, "message": message, "logprobs": _logprobs(gen, c.token_ids, c.logprobs),
                        **finish_fields(c, finish_reason)})
    return {"id": gen.response_id, "object": "chat.completion", "created": gen.created, "model": gen.model,
            "choices": choices, "usage": gen.usage(sum(len(c.token_ids) for c in out.outputs), out.num_cached_tokens),
            **transfer_fields([out])}


class ChatChunks(ChunkRenderer):
    chunk_object = "chat.completion.chunk"

    def __init__(self, gen: Generation) -> None:
        super().__init__(gen)
        self.tools = {k: ToolDeltas(gen.tools) for k in range(gen.n)} if gen.tools else {}
        self.thinking = {k: ReasoningSplitter(gen.reasoning) for k in range(gen.n)} if gen.reasoning else {}
        self.role_sent: set[int] = set()

    def _chunk(self, index: int, delta: dict[str, Any], logprobs=None, finish: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        if index not in self.role_sent:  # the role rides with a choice's first token, as vLLM and OpenAI send it:
            self.role_sent.add(index)    # load testers time the first chunk, so it must not come before the prefill
            # with tools, content is null until some is told apart from calls (OpenAI's first tool-call chunk)
            delta = {"role": "assistant", **({"content": None} if self.tools else {}), **delta}
        return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs,
                            **(finish or {"finish_reason": None, "stop_reason": None})}])

    def delta(self, index: int, c: CompletionOutput):
        lp = _logprobs(self.gen, c.delta_token_ids, c.delta_logprobs)
        reasoning, text = (self.thinking[index].feed(c.delta_text, c.finish_reason is not None) if self.thinking
                           else ("", c.delta_text))
        delta = (self.tools[index].delta(text) if self.tools else {"content": text}) or {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if index in self.role_sent and not any(delta.get(k) for k in ("content", "tool_calls", "reasoning_content")) \
                and not (lp and lp["content"]):
            return None  # nothing new; but a choice's first output always sends its role, even with no text yet
        if not delta and not self.tools:
            delta["content"] = ""
        return self._chunk(index, delta, lp)

    def final(self, index: int, c: CompletionOutput):
        deltas, called = self.tools[index].final() if self.tools else ([], False)
        reason = "tool_calls" if called and c.finish_reason == "stop" else c.finish_reason
        return [self._chunk(index, d) for d in deltas] + [self._chunk(index, {}, None, finish_fields(c, reason))]


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=RESPONSES)
async def create_chat_completion(body: ChatCompletionRequest, request: Request,
                                 state: ServerState = Depends(server_state)) -> Response:
    ignored = check_fields(body, state.options.strict_api)
    gen, stream = await start_generation(state, body, "chatcmpl", request)
    return with_ignored(await respond(state, body, request, gen, stream, ChatChunks, chat_body), ignored)
