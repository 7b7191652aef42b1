"""One chat turn: template the conversation, stream the reply from the shared engine, show metrics.

The conversation the model sees (gr.State) is kept apart from what the page shows, so the metric
line under each reply never leaks into the next prompt.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import AsyncIterator

from app.latency_chart import seconds_text
from runtime.errors import UserError
from runtime.outputs import RequestOutput
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import AsyncEngine, EngineRequest, EngineUnavailableError, QueueFullError
from structured import StructuredOutput

_ids = itertools.count()


@dataclass
class ChatSettings:
    system: str
    temperature: float
    top_p: float
    max_tokens: int
    seed: float | None
    speculative: bool
    json_mode: bool = False  # the reply is a JSON object, as response_format json_object


def metrics_line(out: RequestOutput) -> str:
    m = out.metrics
    n = m.get("num_output_tokens") or len(out.outputs[0].token_ids)
    ttft, tpot = m.get("ttft"), m.get("tpot")
    rate = (n - 1) / (m["e2e"] - ttft) if n > 1 and m.get("e2e") and ttft is not None and m["e2e"] > ttft else None
    parts = [f"TTFT {seconds_text(ttft)}", f"TPOT {seconds_text(tpot)}",
             f"{n} tokens", f"{rate:.1f} tok/s" if rate else "- tok/s"]
    return " · ".join(parts)


def _prepare(engine: AsyncEngine, convo: list[dict], s: ChatSettings, arrival: float) -> EngineRequest:
    """Tokenize and validate; raises UserError with a message fit for the chat. arrival: when the
    message was taken, before templating, as the API counts a request's TTFT from its arrival."""
    limits = engine.limits
    messages = ([{"role": "system", "content": s.system}] if s.system.strip() else []) + convo
    prompt_ids = limits.encode_chat(messages)
    room = limits.max_request_tokens - len(prompt_ids)
    if room < 1:
        raise UserError(f"this conversation is {len(prompt_ids)} tokens, over the context of "
                        f"{limits.max_request_tokens} tokens this server takes; clear the conversation or send "
                        f"something shorter")
    seed = int(s.seed) if s.seed not in (None, "") and s.seed >= 0 else None
    params = SamplingParams(max_tokens=min(int(s.max_tokens), room), temperature=float(s.temperature),
                            top_p=float(s.top_p), seed=seed, speculative=bool(s.speculative),
                            structured=StructuredOutput("json") if s.json_mode else None)
    return EngineRequest(f"chat-{next(_ids)}", engine.admit(prompt_ids, params), arrival)


@dataclass
class Turn:
    """The reply a browser session is generating; Stop or Clear mark it and abort its request."""

    request_id: str | None = None
    ended_by: str | None = None  # "stop" or "clear"


class ChatSessions:
    """The turn in flight per browser session, so Stop and Clear abort it inside the engine.

    The reply generator stays the only writer of the chat while its turn runs: the abort comes back
    as the stream's last output, and the generator renders the stopped (or cleared) turn itself.
    Cancelling the generator instead races with its updates still in flight to the page.
    Everything here runs on the server's event loop, so no locks.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._turns: dict[str, Turn] = {}

    def begin(self, session: str) -> Turn:
        self._turns[session] = turn = Turn()
        return turn

    def end(self, session: str, turn: Turn) -> None:
        if self._turns.get(session) is turn:
            del self._turns[session]

    def interrupt(self, session: str, how: str) -> bool:
        """Stop ("stop") or discard ("clear") the session's turn; False when none is running."""
        turn = self._turns.get(session)
        if turn is None:
            return False
        turn.ended_by = how
        if turn.request_id is not None:
            self.engine.abort(turn.request_id)
        return True


async def reply(sessions: ChatSessions, session: str, message: str, display: list[dict], convo: list[dict],
                settings: ChatSettings) -> AsyncIterator[tuple[list[dict], list[dict], str | None]]:
    """Yields (display, convo, textbox value) as the reply streams. Errors become a chat message.

    The textbox is cleared once, when the message is taken; later updates carry None (leave it as it
    is), so they never erase what the user has started typing next."""
    if not message or not message.strip():  # None, not the empty message: a late answer to a stray Enter
        yield display, convo, None          # must not erase what the user has typed since
        return
    turn = sessions.begin(session)
    try:
        async for update in _stream_turn(sessions.engine, turn, message, display, convo, settings):
            yield update
    finally:
        sessions.end(session, turn)


async def _stream_turn(engine: AsyncEngine, turn: Turn, message: str, display: list[dict], convo: list[dict],
                       settings: ChatSettings) -> AsyncIterator[tuple[list[dict], list[dict], str | None]]:
    arrival = time.perf_counter()
    convo = convo + [{"role": "user", "content": message}]
    display = display + [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
    try:
        request = _prepare(engine, convo, settings, arrival)
        stream = engine.submit([request])
    except (UserError, QueueFullError, EngineUnavailableError) as exc:  # e.g. the server is shutting down
        display[-1] = {"role": "assistant", "content": f"⚠️ {exc}"}
        yield display, convo[:-1], ""
        return
    turn.request_id = request.request_id
    if turn.ended_by:  # Stop came while the request was being prepared
        engine.abort(request.request_id)
    out: RequestOutput | None = None
    try:
        yield display, convo, ""
        async for out in stream:
            display[-1] = {"role": "assistant", "content": out.outputs[0].text}
            yield display, convo, None
    except Exception as exc:  # an engine failure: say so in the chat, keep the page alive
        display[-1] = {"role": "assistant", "content": f"⚠️ engine error: {exc}"}
        yield display, convo[:-1], None
        return
    finally:
        stream.close()  # a cancelled generator (page closed) lands here too: the request is aborted
    if turn.ended_by == "clear":
        yield [], [], None
        return
    text = out.outputs[0].text if out else ""
    convo = convo + [{"role": "assistant", "content": text}]  # a stopped reply too: roles keep alternating
    footer = [metrics_line(out)] if out else []
    if out is None or out.outputs[0].finish_reason == "abort":
        footer.insert(0, "(stopped)")
    display[-1] = {"role": "assistant", "content": f"{text}\n\n*{' · '.join(footer)}*"}
    yield display, convo, None
