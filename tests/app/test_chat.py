"""The chat turn logic without a browser: Stop and Clear abort the engine request, and the reply
generator alone renders the end of the turn (so nothing can repaint the chat after it)."""
import asyncio
import time

from app.chat import ChatSessions, ChatSettings, reply
from runtime.server.async_engine import AsyncEngine
from tests.tiny_engine import tiny_engine

GREEDY = ChatSettings(system="", temperature=0.0, top_p=1.0, max_tokens=400, seed=None, speculative=False)


async def run_turn(sessions, message, interrupt=None, after=3):
    """All updates of one turn; `interrupt` ("stop"/"clear") is sent after `after` streamed updates."""
    updates = []
    async for update in reply(sessions, "s1", message, [], [], GREEDY):
        updates.append(update)
        if interrupt and len(updates) == after:
            assert sessions.interrupt("s1", interrupt)
    return updates


def test_full_turn_ends_with_metrics_and_joins_the_conversation():
    with AsyncEngine(tiny_engine()) as ae:
        settings = ChatSettings(system="be brief", temperature=0.0, top_p=1.0, max_tokens=5, seed=None,
                                speculative=False)

        async def main():
            return [u async for u in reply(ChatSessions(ae), "s1", "hi", [], [], settings)]

        updates = asyncio.run(main())
    display, convo, _ = updates[-1]
    assert [u[2] for u in updates] == [""] + [None] * (len(updates) - 1)  # typing ahead is never erased
    assert [m["role"] for m in convo] == ["user", "assistant"] and convo[0]["content"] == "hi"
    assert "TTFT" in display[-1]["content"] and "(stopped)" not in display[-1]["content"]
    assert display[-1]["content"].startswith(convo[-1]["content"])  # metrics only on the page


def test_stop_aborts_the_request_and_the_generator_renders_it_stopped():
    with AsyncEngine(tiny_engine()) as ae:
        sessions = ChatSessions(ae)
        updates = asyncio.run(run_turn(sessions, "tell me a long story", interrupt="stop"))
        assert ae.engine.pool.num_used == 0 and not ae.engine.has_unfinished_requests()
        assert not sessions.interrupt("s1", "stop")  # the turn is over: nothing left to stop
    display, convo, _ = updates[-1]
    partial = convo[-1]["content"]
    assert [m["role"] for m in convo] == ["user", "assistant"]  # the next turn still alternates roles
    assert display[-1]["content"].startswith(partial) and "*(stopped) · TTFT" in display[-1]["content"]
    assert len(updates) < 50  # it stopped long before max_tokens=400


def test_clear_ends_the_turn_with_an_empty_chat():
    with AsyncEngine(tiny_engine()) as ae:
        updates = asyncio.run(run_turn(ChatSessions(ae), "tell me a long story", interrupt="clear"))
        assert ae.engine.pool.num_used == 0
    assert updates[-1] == ([], [], None)


def test_stop_before_the_request_reaches_the_engine_still_stops_it():
    with AsyncEngine(tiny_engine()) as ae:
        sessions = ChatSessions(ae)
        begin = sessions.begin

        def begin_then_stop(session):  # Stop lands while the prompt is still being tokenized
            turn = begin(session)
            sessions.interrupt(session, "stop")
            return turn

        sessions.begin = begin_then_stop
        updates = asyncio.run(run_turn(sessions, "hello"))
        assert ae.engine.pool.num_used == 0
    assert "(stopped)" in updates[-1][0][-1]["content"] and len(updates) <= 3


def test_empty_message_and_overlong_conversation_do_not_reach_the_engine():
    with AsyncEngine(tiny_engine()) as ae:
        sessions = ChatSessions(ae)

        async def main(message):
            return [u async for u in reply(sessions, "s1", message, [], [], GREEDY)]

        # None leaves the box alone: the answer to a stray Enter may come late on a busy server, after
        # the user has typed the real message, which it must not erase
        assert asyncio.run(main("   ")) == [([], [], None)]
        display, convo, _ = asyncio.run(main("x" * 5000))[-1]
        assert convo == [] and "context" in display[-1]["content"]
        assert ae.snapshot().prompt_tokens == 0


def test_a_turn_while_the_server_shuts_down_says_so_in_the_chat():
    with AsyncEngine(tiny_engine()) as ae:
        ae.drain()

        async def main():
            return [u async for u in reply(ChatSessions(ae), "s1", "hi", [], [], GREEDY)]

        display, convo, box = asyncio.run(main())[-1]
    assert "shutting down" in display[-1]["content"] and convo == [] and box == ""


def test_json_mode_makes_the_reply_a_json_object():
    settings = ChatSettings(system="", temperature=0.0, top_p=1.0, max_tokens=40, seed=None, speculative=False,
                            json_mode=True)
    with AsyncEngine(tiny_engine()) as ae:
        async def main():
            return [u async for u in reply(ChatSessions(ae), "s1", "a point, please", [], [], settings)]

        plain = asyncio.run(run_turn(ChatSessions(ae), "a point, please"))
        updates = asyncio.run(main())
    answer, free = updates[-1][1][-1]["content"], plain[-1][1][-1]["content"]
    assert answer.startswith("{") and not free.startswith("{")  # the grammar, not the model, made it JSON
    assert all(u[0][-1]["content"].startswith("{") for u in updates[2:])  # every streamed piece too


def test_ttft_counts_from_the_message_taken_as_the_api_counts_from_the_request(monkeypatch):
    """The chat footer's TTFT is the engine's (first token - arrival); arrival is when the message was
    taken, before the chat template runs, as the API stamps a request before tokenizing it. A
    template that takes 0.3 s shows in the TTFT."""
    from app.chat import metrics_line

    with AsyncEngine(tiny_engine()) as ae:
        limits = type(ae.limits)  # a frozen dataclass: patched on its class
        encode = limits.encode_chat

        def slow_encode(self, *args, **kwargs):
            time.sleep(0.3)
            return encode(self, *args, **kwargs)

        monkeypatch.setattr(limits, "encode_chat", slow_encode)
        finished = Finished()
        ae.add_observer(finished)
        updates = asyncio.run(run_turn(ChatSessions(ae), "hi"))
    (out,) = finished.outputs
    assert out.metrics["ttft"] >= 0.3
    assert metrics_line(out) in updates[-1][0][-1]["content"]  # the footer is the engine's figure


class Finished:
    """An AsyncEngine observer (as the server's metrics are) keeping each finished RequestOutput."""

    def __init__(self) -> None:
        self.outputs = []

    def on_output(self, output, now, token_gap) -> None:
        if output.finished:
            self.outputs.append(output)
