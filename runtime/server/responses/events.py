"""A streamed Response: the chat stream's chunks as the Responses API's typed events, each with its
sequence_number: response.created, in_progress; per output item added, its deltas (output_text or
function_call_arguments), done; then response.completed."""
from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from runtime.server.async_engine import AsyncEngine, RequestStream
from runtime.server.errors import APIError, as_api_error
from runtime.server.openai.generation import aborted_error
from runtime.server.openai.sse import ChunkRenderer
from runtime.server.responses.convert import dumps, new_id

Finish = Callable[[list[dict[str, Any]], str | None, dict[str, Any] | None, str | None], dict[str, Any]]


class ResponseEvents:
    def __init__(self, finish: Finish) -> None:
        self.finish = finish  # (items, finish reason, usage, status) -> the Response (stored when asked)
        self.seq, self.items = 0, []
        self.message: dict[str, Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool_call index -> its item
        self.reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        return f"event: {kind}\ndata: {dumps({'type': kind, 'sequence_number': self.seq - 1, **fields})}\n\n"

    def start(self) -> list[str]:
        stub = self.finish([], None, None, "in_progress")
        return [self.event("response.created", response=stub), self.event("response.in_progress", response=stub)]

    def _added(self, item: dict[str, Any]) -> str:
        self.items.append(item)
        return self.event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))

    def chunk(self, payload: dict[str, Any]) -> list[str]:
        """The events of one chat chunk."""
        if payload.get("usage"):
            self.usage = payload["usage"]
        out: list[str] = []
        for choice in payload.get("choices", []):
            self.reason = choice.get("finish_reason") or self.reason
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for tc in delta.get("tool_calls") or []:
                out += self._call(tc)
        return out

    def _text(self, piece: str) -> list[str]:
        out = []
        if self.message is None:
            self.message = {"type": "message", "id": new_id("msg"), "status": "in_progress", "role": "assistant",
                            "content": []}
            out.append(self._added(self.message))
            out.append(self.event("response.content_part.added", item_id=self.message["id"], output_index=self._at(
                self.message), content_index=0, part={"type": "output_text", "text": "", "annotations": []}))
            self.message["content"] = [{"type": "output_text", "text": "", "annotations": []}]
        self.message["content"][0]["text"] += piece
        out.append(self.event("response.output_text.delta", item_id=self.message["id"],
                              output_index=self._at(self.message), content_index=0, delta=piece))
        return out

    def _call(self, tc: dict[str, Any]) -> list[str]:
        out = []
        item = self.calls.get(tc["index"])
        if item is None:
            item = self.calls[tc["index"]] = {"type": "function_call", "id": new_id("fc"), "call_id": tc.get("id"),
                                              "name": tc["function"].get("name"), "arguments": "",
                                              "status": "in_progress"}
            out.append(self._added(item))
        piece = (tc.get("function") or {}).get("arguments") or ""
        if piece:
            item["arguments"] += piece
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=self._at(item), delta=piece))
        return out

    def _at(self, item: dict[str, Any]) -> int:
        return next(i for i, x in enumerate(self.items) if x is item)

    def end(self) -> list[str]:
        out = []
        for i, item in enumerate(self.items):
            item["status"] = "completed"
            if item["type"] == "message":
                part = item["content"][0]
                out.append(self.event("response.output_text.done", item_id=item["id"], output_index=i,
                                      content_index=0, text=part["text"]))
                out.append(self.event("response.content_part.done", item_id=item["id"], output_index=i,
                                      content_index=0, part=part))
            else:
                out.append(self.event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                      arguments=item["arguments"]))
            out.append(self.event("response.output_item.done", output_index=i, item=item))
        # response.completed even when cut by max_output_tokens (its status says "incomplete"): the
        # openai SDK's stream helper ends only on it, as vLLM sends it
        return out + [self.event("response.completed", response=self.finish(self.items, self.reason, self.usage, None))]

    def error(self, err: APIError) -> str:
        return self.event("error", code=err.code, message=err.message, param=err.param)


async def response_events(stream: RequestStream, renderer: ChunkRenderer, events: ResponseEvents,
                          engine: AsyncEngine) -> AsyncIterator[str]:
    try:
        for e in events.start():
            yield e
        async for out in stream:
            for payload in renderer.output(out):
                for e in events.chunk(payload):
                    yield e
        for payload in renderer.end():
            events.chunk(payload)
        if renderer.aborted or renderer.failed:
            yield events.error(renderer.failed or aborted_error(engine))
            return
        for e in events.end():
            yield e
    except Exception as exc:  # not CancelledError / GeneratorExit: those mean the client is gone
        yield events.error(as_api_error(exc))
    finally:
        stream.close()
