"""What each engine step did, for the listeners that want it per step: the metrics (tokens per step)
and the tracer (each phase's interval, for the requests the step produced output for).

Runs on the engine thread, inside AsyncEngine's step loop: begin() before LLMEngine.step(), end()
after it. The phases come from the engine's PhaseTimer through its listener seam, so their
intervals are the timer's own stamps. Listeners must be quick and thread-safe.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from runtime.engine import LLMEngine
from runtime.outputs import RequestOutput

log = logging.getLogger("cute_serve")


@dataclass
class StepRecord:
    phases: list[tuple[str, float, float]]  # (phase, start, end) in time.perf_counter seconds, in order
    tokens: int  # prefill tokens computed + tokens generated: vLLM's iteration tokens
    request_ids: list[str] = field(default_factory=list)  # the requests this step produced output for

    @property
    def start(self) -> float:
        return self.phases[0][1]

    @property
    def end(self) -> float:
        return self.phases[-1][2]


StepListener = Callable[[StepRecord], None]


class StepFeed:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.listeners: list[StepListener] = []
        self._phases: list[tuple[str, float, float]] = []
        self._tokens_before = 0

    def add(self, listener: StepListener) -> None:
        """Hear every step from now on (the engine's timer reports its phases while anyone listens)."""
        self.listeners.append(listener)
        self.engine.timer.listener = self._on_phase

    def remove(self, listener: StepListener) -> None:
        if listener in self.listeners:
            self.listeners.remove(listener)
        if not self.listeners:
            self.engine.timer.listener = None

    def _on_phase(self, phase: str, start: float, end: float) -> None:
        self._phases.append((phase, start, end))

    def _tokens(self) -> int:
        s = self.engine.stats
        return s.computed_prefill_tokens + s.generated_tokens

    def begin(self) -> None:
        if self.listeners:
            self._phases = []
            self._tokens_before = self._tokens()

    def end(self, outputs: list[RequestOutput]) -> None:
        if not self.listeners or not self._phases:
            return
        record = StepRecord(self._phases, self._tokens() - self._tokens_before, [o.request_id for o in outputs])
        for listener in list(self.listeners):
            try:
                listener(record)
            except Exception:  # metrics and traces must never break serving
                log.exception("step listener failed")
