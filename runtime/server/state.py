"""What every route needs: the engine, the served model's name, the metrics, the grammar compiles; one per app."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from runtime.server.async_engine import AsyncEngine
from runtime.server.errors import APIError
from runtime.server.grammar_compiles import CompileWaits
from runtime.server.guards.rate_limit import AuthThrottle
from runtime.server.late_page import LatePage
from runtime.server.metrics import ServerMetrics
from runtime.server.openai.logprobs import LogprobFormatter
from runtime.server.options import ServerOptions
from runtime.server.request_log import RequestTelemetry


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    formatter: LogprobFormatter
    compiles: CompileWaits  # requests' grammars being compiled
    options: ServerOptions = field(default_factory=ServerOptions)
    page: LatePage | None = None  # the chat page, mounted after start-up
    auth_throttle: AuthThrottle | None = None  # failed key checks per client address (with --api-key)
    created: int = field(default_factory=lambda: int(time.time()))
    telemetry: RequestTelemetry | None = None  # access log and traces, when either is on

    def close(self) -> None:
        """Detach the metrics and telemetry from the engine (and flush the traces)."""
        self.metrics.close()
        if self.telemetry is not None:
            self.telemetry.close()

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"the model '{name}' does not exist; this server serves '{self.model_name}'",
                           "model", "model_not_found")


def server_state(request: Request) -> ServerState:
    """FastAPI dependency: the app's ServerState."""
    return request.app.state.server
