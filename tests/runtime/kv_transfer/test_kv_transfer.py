"""Prefill/decode disaggregation in one process: a prefill and a decode server over the same tiny weights,
driven with vLLM's proxy protocol; greedy outputs equal a colocated server's, with the blocks moved or,
after any fault on the way, recomputed (counted in /metrics, never a token from a wrong block)."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.server import metric_defs
from runtime.tiers.kv_transfer import connector
from runtime.tiers.kv_transfer.attach import wants_transfer
from tests.runtime.kv_transfer.fault_proxy import Fault, FaultProxy
from tests.runtime.kv_transfer.pd_pair import ENGINE, FIRST_PAYLOAD, Pair, metric, pd_pair
from tests.server_utils import live_server
from tests.tiny_engine import tiny_engine

PROMPT = "The quick brown fox jumps over the lazy dog; " * 3  # 135 bytes: 8 full blocks of 16 byte tokens
CHAT = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16, "temperature": 0, "ignore_eos": True}
_prompts = iter(range(10**6))


def body() -> dict:
    """A completion request whose prompt no server has seen (its blocks are in no prefix cache yet)."""
    return {"prompt": f"{next(_prompts):03d}{PROMPT[3:]}", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
# a tiny block's KV: 2 layers, K and V, 16 tokens, 2 heads x 16, in the CPU cache's default bf16
BLOCK_FRAME = FIRST_PAYLOAD + 2 * 2 * 16 * 2 * 16 * 2
STALL_S = 2.0  # the decode side's --kv-transfer-timeout
FAILED, LOADED, RECOMPUTED = ("vllm:nixl_num_failed_transfers_total", "cute_serve:kv_transfer_loaded_blocks_total",
                              "cute_serve:kv_transfer_recomputed_blocks_total")


@pytest.fixture(scope="module")
def pair():
    with pd_pair(decode={"kv_transfer_timeout": STALL_S}) as p:
        yield p


def colocated(pair: Pair, body: dict, path: str = "/v1/completions") -> dict:
    r = httpx.post(pair.colocated.url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def text(answer: dict) -> str:
    choice = answer["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def counters(pair: Pair) -> dict[str, float]:
    return {name: metric(pair.decode, name) for name in (FAILED, LOADED, RECOMPUTED)}


def test_greedy_outputs_equal_colocated_with_the_prompt_kv_moved(pair):
    req = body()
    before = counters(pair)
    hits = metric(pair.decode, "vllm:external_prefix_cache_hits_total")
    params = pair.prefill_answer(req)
    assert params["do_remote_prefill"] and params["remote_port"] and params["remote_request_id"]
    assert metric(pair.prefill, "cute_serve:kv_transfer_held_requests") == 1
    assert text(pair.decode_answer(req, params)) == text(colocated(pair, req))
    after = counters(pair)
    assert after[LOADED] - before[LOADED] == 8 and after[FAILED] == before[FAILED]
    assert metric(pair.decode, "vllm:external_prefix_cache_hits_total") - hits == 8 * 16
    assert metric(pair.prefill, "cute_serve:kv_transfer_held_requests") == 0
    assert metric(pair.decode, "vllm:nixl_xfer_time_seconds_count") >= 1
    assert metric(pair.decode, "vllm:nixl_bytes_transferred_sum") >= 8 * BLOCK_FRAME
    assert text(pair.disaggregated(CHAT, "/v1/chat/completions")) == text(colocated(pair, CHAT, "/v1/chat/completions"))
    pair.decode.wait_idle()


@pytest.mark.parametrize("fault,intact", [
    (Fault("flip", 2 * BLOCK_FRAME + FIRST_PAYLOAD + 100), 2),  # a payload byte of the third block: its CRC fails
    (Fault("flip", BLOCK_FRAME + FIRST_PAYLOAD - 8), 1),  # a token id of the second block
    (Fault("close", 3 * BLOCK_FRAME + 500), 3),  # the connection breaks inside the fourth block
])
def test_a_corrupt_or_broken_transfer_keeps_the_good_blocks_and_recomputes_the_rest(pair, fault, intact):
    req = body()
    params = pair.prefill_answer(req)
    proxy = FaultProxy(("127.0.0.1", params["remote_port"]), fault)
    before = counters(pair)
    try:
        out = pair.decode_answer(req, {**params, "remote_port": proxy.port})
    finally:
        proxy.close()
    assert text(out) == text(colocated(pair, req))
    after = counters(pair)
    assert after[FAILED] - before[FAILED] == 1
    assert (after[LOADED] - before[LOADED], after[RECOMPUTED] - before[RECOMPUTED]) == (intact, 8 - intact)


def test_a_stalled_transfer_times_out_while_other_requests_keep_streaming(pair):
    req = body()
    params = pair.prefill_answer(req)
    proxy = FaultProxy(("127.0.0.1", params["remote_port"]), Fault("stall", 2 * BLOCK_FRAME + 10))
    before, result = counters(pair), {}

    def stalled() -> None:
        start = time.perf_counter()
        result["answer"] = pair.decode_answer(req, {**params, "remote_port": proxy.port})
        result["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=stalled)
    thread.start()
    try:
        time.sleep(0.2)  # the stalled fetch has begun: a plain request streams beside it meanwhile
        with httpx.stream("POST", pair.decode.url + "/v1/completions", timeout=30,
                          json={"prompt": "hi", "max_tokens": 12, "ignore_eos": True, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        still_stalled = thread.is_alive()
        thread.join(30)
    finally:
        proxy.close()
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    assert still_stalled  # it streamed and ended while the stalled fetch still waited
    assert result["seconds"] >= STALL_S and text(result["answer"]) == text(colocated(pair, req))
    after = counters(pair)
    assert after[FAILED] - before[FAILED] == 1 and after[LOADED] - before[LOADED] == 2


def test_a_prefill_instance_that_is_gone_means_a_recompute(pair):
    req = body()
    params = pair.prefill_answer(req)
    with socket.socket() as gone:  # a port nothing listens on: connection refused
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
    before = counters(pair)
    assert text(pair.decode_answer(req, {**params, "remote_port": port})) == text(colocated(pair, req))
    assert counters(pair)[FAILED] - before[FAILED] == 1


def test_blocks_never_fetched_are_freed_after_the_hold_timeout_and_counted(pair):
    req = body()
    with live_server(tiny_engine(kv_role="prefill", kv_hold_timeout=0.3, **ENGINE)) as prefill:
        pair = Pair(prefill, pair.decode, pair.colocated)
        params = pair.prefill_answer(req)
        deadline = time.monotonic() + 10
        while metric(pair.prefill, "vllm:nixl_num_kv_expired_reqs_total") < 1:
            assert time.monotonic() < deadline, "the held blocks never expired"
            time.sleep(0.05)
        assert metric(pair.prefill, "cute_serve:kv_transfer_held_requests") == 0
        assert metric(pair.prefill, "cute_serve:kv_transfer_held_bytes") == 0
        before = counters(pair)
        assert text(pair.decode_answer(req, params)) == text(colocated(pair, req))  # too late: recomputed
        assert counters(pair)[RECOMPUTED] - before[RECOMPUTED] == 8


def test_a_full_decode_pool_waits_for_room_then_loads(pair):
    req = body()
    # 64 blocks: a 600-token request holds 38 of them, so the 9 a transfer needs wait until it is done
    params = pair.prefill_answer(req)
    with httpx.stream("POST", pair.decode.url + "/v1/completions", timeout=30,
                      json={"prompt": "x" * 500, "max_tokens": 100, "ignore_eos": True, "stream": True}) as big:
        lines = big.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # it runs and holds its blocks
        hog = threading.Thread(target=lambda: list(lines))
        hog.start()
        assert text(pair.decode_answer(req, params)) == text(colocated(pair, req))
        hog.join(30)
    pair.decode.wait_idle()


def test_kv_transfer_params_of_the_wrong_type_are_a_400_naming_the_field(pair):
    req = body()
    r = httpx.post(pair.decode.url + "/v1/completions", json={**req, "kv_transfer_params": {"remote_port": "x"}})
    assert r.status_code == 400 and "kv_transfer_params" in r.text and "remote_port" in r.text


def test_the_histograms_buckets_are_metric_defs():
    assert connector.XFER_TIME_BUCKETS == metric_defs.XFER_TIME_BUCKETS
    assert connector.XFER_BYTES_BUCKETS == metric_defs.XFER_BYTES_BUCKETS


def test_the_role_is_named_where_the_chat_page_reads_it(pair):
    assert pair.prefill.async_engine.describe()["kv role"] == "prefill"
    assert pair.colocated.async_engine.describe()["kv role"] == "both"


@pytest.mark.parametrize("settings,why", [
    ({"enable_prefix_caching": False}, "prefix caching"),
    ({"scheduler": "static"}, "continuous batching"),
    ({"tensor_parallel_size": 2}, "tensor-parallel"),
    ({"pipeline_parallel_size": 2}, "pipeline-parallel"),
    ({"kv_transfer_timeout": 0}, "must be > 0"),
])
def test_settings_a_role_cannot_run_with_are_a_clear_error(settings, why):
    with pytest.raises(UserError, match=why):
        wants_transfer(EngineConfig(kv_role="decode", **settings), tiered=False)
    with pytest.raises(UserError, match="KV tiers"):
        wants_transfer(EngineConfig(kv_role="prefill"), tiered=True)
    assert not wants_transfer(EngineConfig(), tiered=True)  # both: no connector of its own
