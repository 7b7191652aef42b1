"""GET /v1/models (and one by its id), /health and /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from runtime.server.errors import ERROR_RESPONSES, as_api_error, error_response
from runtime.server.openai.protocol import ErrorResponse, HealthStatus, ModelCard, ModelList
from runtime.server.state import ServerState, server_state

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses={401: ERROR_RESPONSES[401]})
async def list_models(state: ServerState = Depends(server_state)) -> ModelList:
    return ModelList(data=[_card(state)])


# :path - a served name may hold slashes ("HuggingFaceTB/SmolLM2-135M-Instruct")
@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses={401: ERROR_RESPONSES[401],
                                                                             404: ERROR_RESPONSES[404]})
async def retrieve_model(model_id: str, state: ServerState = Depends(server_state)) -> ModelCard:
    state.check_model(model_id)  # 404 model_not_found for any other id
    return _card(state)


def _card(state: ServerState) -> ModelCard:
    return ModelCard(id=state.model_name, created=state.created, max_model_len=state.engine.limits.max_model_len)


@router.get("/health", response_model=HealthStatus,
            responses={503: {"model": ErrorResponse, "description": "The engine thread is not running"}})
async def health(state: ServerState = Depends(server_state)) -> Response:
    unavailable = state.engine.unavailable_error()
    if unavailable is not None:
        return error_response(as_api_error(unavailable))
    # the chat page mounts after the API answers: clients that want it wait for "ready"
    return JSONResponse({"status": "ok", **({"chat_page": state.page.status} if state.page else {})})


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(state: ServerState = Depends(server_state)) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
