"""AsyncEngine without HTTP: streams match the offline engine, close() aborts at once, failures stay contained."""
import asyncio
import time

import pytest

from runtime.errors import RequestError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from runtime.server.async_engine import (
    AsyncEngine,
    EngineRequest,
    EngineStepError,
    EngineUnavailableError,
    QueueFullError,
)
from tests.tiny_engine import tiny_engine

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
ENGINE_LIMITS = tiny_engine().limits  # every tiny engine's: one vocabulary and context
LONG = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)


def request(rid, prompt, params=GREEDY):
    return EngineRequest(rid, ENGINE_LIMITS.admit(list(prompt), params))


async def run_stream(async_engine, requests):
    """{request id: (concatenated delta ids, finish reasons)} of one submitted group."""
    ids, reasons = {}, {}
    stream = async_engine.submit(requests)
    try:
        async for out in stream:
            ids.setdefault(out.request_id, []).extend(out.outputs[0].delta_token_ids)
            if out.finished:
                reasons[out.request_id] = out.outputs[0].finish_reason
    finally:
        stream.close()
    return ids, reasons


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def test_concurrent_streams_match_offline_generate():
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44], list(range(60, 100)), [7]]
    want = [o.outputs[0].token_ids for o in LLM.from_engine(tiny_engine()).generate(prompts, GREEDY, use_tqdm=False)]

    async def main(ae):
        groups = [[request(f"r{i}", p)] for i, p in enumerate(prompts)]
        return await asyncio.gather(*(run_stream(ae, g) for g in groups))

    with AsyncEngine(tiny_engine()) as ae:
        results = asyncio.run(main(ae))
        wait_until(lambda: ae.snapshot().kv_blocks_used == 0)
    for i, (ids, reasons) in enumerate(results):
        assert ids[f"r{i}"] == want[i]
        assert reasons[f"r{i}"] == "length"


def test_close_aborts_and_frees_blocks_before_the_next_step():
    engine = tiny_engine()

    async def main(ae):
        stream = ae.submit([request("long", [5, 6, 7] * 20, LONG)])
        for _ in range(3):
            await stream.__anext__()
        assert engine.pool.num_used > 0
        steps_at_close = engine.stats.steps
        stream.close()
        return steps_at_close

    with AsyncEngine(engine) as ae:
        steps_at_close = asyncio.run(main(ae))
        wait_until(lambda: ae.snapshot().kv_blocks_used == 0 and not engine.requests)
        # one step may have been running when close() was called; the abort lands before the next
        assert engine.stats.steps - steps_at_close <= 2
        assert engine.stats.finished["abort"] == 1
        assert engine.stats.generated_tokens < 50
        assert ae.num_seqs_in_flight == 0


def test_admit_rejects_what_the_engine_would_and_nothing_is_enqueued():
    with AsyncEngine(tiny_engine()) as ae:
        with pytest.raises(RequestError, match="context length"):
            ae.admit([1] * 10, SamplingParams(max_tokens=5000))
        with pytest.raises(RequestError, match="logit_bias"):
            ae.admit([1], SamplingParams(logit_bias={10**6: 1.0}))
        assert not ae.engine.requests and ae.num_seqs_in_flight == 0


def test_add_failure_reaches_the_stream_as_request_error():
    async def main(ae):
        # skipped check(): the engine thread's add_request rejects it and the stream says why
        return await run_stream(ae, [request("bad", [999])])

    with AsyncEngine(tiny_engine()) as ae:
        with pytest.raises(RequestError, match="not in"):
            asyncio.run(main(ae))
        assert ae.num_seqs_in_flight == 0
        assert asyncio.run(run_stream(ae, [request("good", [1, 2])]))[1] == {"good": "length"}


def test_queue_limit_counts_sequences_and_recovers():
    engine = tiny_engine(max_num_seqs=2)

    async def main(ae):
        first = ae.submit([request("a", [1, 2], LONG), request("b", [3, 4], LONG)])
        with pytest.raises(RequestError, match="at most 3"):
            ae.submit([request("huge", [1], SamplingParams(n=4, max_tokens=4))])
        second = ae.submit([request("c", [5, 6], LONG)])
        with pytest.raises(QueueFullError, match="capacity"):
            ae.submit([request("d", [7, 8], GREEDY)])
        first.close()
        second.close()
        return await run_stream(ae, [request("e", [9], GREEDY)])

    with AsyncEngine(engine, max_queue=1) as ae:
        ids, reasons = asyncio.run(main(ae))
        assert reasons == {"e": "length"} and len(ids["e"]) == 12
        wait_until(lambda: ae.snapshot().kv_blocks_used == 0 and not engine.requests)


def test_a_failing_step_fails_requests_in_flight_but_the_engine_keeps_serving():
    engine = tiny_engine()
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = flaky_step
    with AsyncEngine(engine) as ae:
        with pytest.raises(EngineStepError, match="injected fault"):
            asyncio.run(run_stream(ae, [request("victim", [1, 2, 3], LONG)]))
        wait_until(lambda: ae.snapshot().kv_blocks_used == 0 and not engine.requests)
        ids, reasons = asyncio.run(run_stream(ae, [request("next", [1, 2, 3])]))
        assert reasons == {"next": "length"} and len(ids["next"]) == 12
        assert ae.is_running


def test_idle_engine_sleeps_and_shutdown_fails_open_streams():
    engine = tiny_engine()
    ae = AsyncEngine(engine).start()
    asyncio.run(run_stream(ae, [request("warm", [1])]))
    steps = engine.stats.steps
    time.sleep(0.2)
    assert engine.stats.steps == steps  # no busy loop while idle

    async def main():
        stream = ae.submit([request("long", [1, 2], LONG)])
        await stream.__anext__()
        await asyncio.get_running_loop().run_in_executor(None, ae.shutdown)
        async for _ in stream:
            pass

    with pytest.raises(EngineUnavailableError):
        asyncio.run(main())
    assert not ae.is_running
    with pytest.raises(EngineUnavailableError):
        asyncio.run(run_stream(ae, [request("late", [1])]))
    assert engine.pool.num_used == 0


def test_requests_of_a_closed_event_loop_are_aborted_and_give_back_their_seats():
    async def submit_and_leave(ae):
        ae.submit([request("orphan", [1, 2, 3], LONG)])  # never read, never closed

    with AsyncEngine(tiny_engine()) as ae:
        asyncio.run(submit_and_leave(ae))  # asyncio.run closes the loop behind the stream
        wait_until(lambda: "orphan" not in ae.engine.requests and ae.num_seqs_in_flight == 0)
        wait_until(lambda: ae.snapshot().kv_blocks_used == 0)
