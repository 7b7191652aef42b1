"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API for text and function tools,
run as a chat completion; stored responses (store, the default) continue with previous_response_id."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from runtime.server.errors import APIError
from runtime.server.openai.chat import ChatChunks, assistant_message
from runtime.server.openai.generation import json_response
from runtime.server.openai.leniency import check_fields
from runtime.server.openai.prepare import start_generation
from runtime.server.openai.sse import with_ignored
from runtime.server.openapi import generation_responses
from runtime.server.responses.convert import (
    as_messages,
    chat_request,
    new_id,
    output_items,
    response_object,
)
from runtime.server.responses.events import ResponseEvents, response_events
from runtime.server.responses.protocol import ResponsesRequest, ResponseStreamEvent
from runtime.server.responses.store import ResponseStore, StoredResponse
from runtime.server.state import ServerState, server_state

router = APIRouter()
RESPONSES = generation_responses(ResponseStreamEvent, 'event: response.created\ndata: {"type":"response.created",'
                                                      '"sequence_number":0,"response":{...}}\n\n')


def response_store(request: Request) -> ResponseStore:
    return request.app.state.responses


@router.post("/v1/responses", responses=RESPONSES)
async def create_response(body: ResponsesRequest, request: Request, state: ServerState = Depends(server_state),
                          store: ResponseStore = Depends(response_store)) -> Response:
    ignored = check_fields(body, state.options.strict_api)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise APIError(400, f"previous response '{body.previous_response_id}' is not stored here (at most "
                           f"{store.max_responses} are kept, in memory)", "previous_response_id", "not_found")
        history = previous.conversation
    chat, conversation = chat_request(body, history)
    gen, stream = await start_generation(state, chat, "resp", request)
    response_id = new_id("resp")

    def finish(items: list[dict[str, Any]], reason: str | None, usage: dict[str, Any] | None,
               status: str | None) -> dict[str, Any]:
        response = response_object(body, response_id, gen.created, gen.model, items, reason, usage, status)
        if body.store and status is None:
            store.put(StoredResponse(response, conversation + as_messages(items)))
        return response

    if body.stream:
        events = response_events(stream, ChatChunks(gen), ResponseEvents(finish), state.engine)
        return with_ignored(StreamingResponse(events, media_type="text/event-stream",
                                              headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                              background=BackgroundTask(stream.close)), ignored)

    def json_body(finals) -> dict[str, Any]:
        out = finals[gen.prompts[0].request.request_id]
        c = out.outputs[0]
        message, reason = assistant_message(gen, c.text, c.finish_reason)
        return finish(output_items(message), reason, gen.usage(len(c.token_ids), out.num_cached_tokens), None)

    return with_ignored(await json_response(request, stream, state.engine, gen, json_body), ignored)


@router.get("/v1/responses/{response_id}", responses={k: RESPONSES[k] for k in (401, 404)})
async def retrieve_response(response_id: str, store: ResponseStore = Depends(response_store)) -> JSONResponse:
    item = store.get(response_id)
    if item is None:
        raise APIError(404, f"no response '{response_id}' is stored here", "response_id", "not_found")
    return JSONResponse(item.response)
