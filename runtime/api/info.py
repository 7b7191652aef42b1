"""GET /v1/models, /health and /metrics."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from runtime.api.errors import ERROR_RESPONSES, error_body
from runtime.api.protocol import ErrorResponse, HealthStatus, ModelCard, ModelList
from runtime.api.state import ServerState, server_state

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses={401: ERROR_RESPONSES[401]})
async def list_models(state: ServerState = Depends(server_state)) -> ModelList:
    card = ModelCard(id=state.model_name, created=state.created, max_model_len=state.engine.engine.max_model_len)
    return ModelList(data=[card])


@router.get("/health", response_model=HealthStatus,
            responses={503: {"model": ErrorResponse, "description": "The engine thread is not running"}})
async def health(state: ServerState = Depends(server_state)) -> Response:
    if not state.engine.is_running:
        why = f": {state.engine.error}" if state.engine.error else ""
        return JSONResponse(error_body(503, f"the engine is not running{why}", code="engine_unavailable"), 503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(state: ServerState = Depends(server_state)) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
