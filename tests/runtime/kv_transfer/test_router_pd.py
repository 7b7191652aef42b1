"""An existing router drives our pair unchanged: vllm-router's vLLM prefill/decode mode over a `--kv-role
prefill` and a `--kv-role decode` instance of `python -m runtime.serve` (a tiny random model) on 127.0.0.1.
Then the prefill instance dies after answering: the decode instance recomputes the prompt itself."""
from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from profiling.benchmarks.bench_serving import start_server, stop_server
from profiling.benchmarks.pd_router import vllm_pd_router
from tests.runtime.kv_transfer.pd_pair import metric
from tests.server_utils import LiveServer, write_tiny_model

PROMPT = "Disaggregated serving splits the prompt from the answer. " * 3  # 171 bytes: 10 full blocks
COMMON = ["--host", "127.0.0.1", "--log-level", "warning", "--kv-cache-memory", "8MiB"]


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    model = write_tiny_model(str(tmp_path_factory.mktemp("tiny")))
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:  # both start at once
        starts = [pool.submit(start_server, [*COMMON, "--model", model, "--kv-role", role, "--kv-transfer-timeout", "3"],
                              log, 120) for role, log in zip(("prefill", "decode"), logs)]
    procs = [f.result() for f in starts if f.exception() is None]
    try:
        assert len(procs) == 2, [str(f.exception()) for f in starts]
        yield procs
    finally:
        for proc, _ in procs:
            stop_server(proc)
        for log in logs:
            log.close()


def complete(url: str, prompt: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/completions", timeout=60, json={"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                                                 "ignore_eos": True, **extra})


def test_vllm_router_drives_the_pair_and_the_answer_is_the_colocated_one(instances):
    (_, prefill), (_, decode) = instances
    colocated = complete(prefill, PROMPT).json()["choices"][0]["text"]  # the prefill instance, serving it whole
    with vllm_pd_router(prefill, decode) as router:
        r = complete(router, PROMPT)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == colocated
        chat = httpx.post(router + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] is not None
    d = LiveServer(decode)
    assert metric(d, "cute_serve:kv_transfer_loaded_blocks_total") >= 10 + 10  # both prompts' blocks moved
    assert metric(d, "vllm:nixl_num_failed_transfers_total") == 0
    assert metric(LiveServer(prefill), "cute_serve:kv_transfer_held_requests") == 0


def test_the_prefill_instance_dies_after_answering_and_the_decode_instance_recomputes(instances):
    (prefill_proc, prefill), (_, decode) = instances
    prompt = "Another prompt, for an instance about to die. " * 3
    colocated = complete(prefill, prompt).json()["choices"][0]["text"]
    answer = complete(prefill, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True}).json()
    prefill_proc.kill()
    prefill_proc.wait(10)
    failed = metric(LiveServer(decode), "vllm:nixl_num_failed_transfers_total")
    r = complete(decode, prompt, kv_transfer_params=answer["kv_transfer_params"])
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == colocated
    assert metric(LiveServer(decode), "vllm:nixl_num_failed_transfers_total") == failed + 1
