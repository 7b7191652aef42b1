"""Tensor parallelism on the CPU (gloo): the same tokens as one process, with every engine feature, and
worker failures that fail fast instead of hanging; no worker process outlives the tests."""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import re
import signal
import tempfile
import threading
import time

import httpx
import pytest
import torch

from runtime.build import draft_proposer
from runtime.engine_config import EngineConfig
from runtime.errors import EngineDeadError, UserError
from runtime.llm import LLM
from runtime.parallel.plan import check_tp_size, local_config, rank_shard
from runtime.parallel.shard import shard_checkpoint
from runtime.sampling_params import SamplingParams
from tests.runtime.spec.test_spec import mixed_prompts
from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine, tiny_weights

PROMPTS = ["hello world", "the quick brown fox", "abc" * 20, "tensor parallel " * 6]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=24, ignore_eos=True, temperature=1.0, top_p=0.9, seed=7)


def tp_workers() -> list[mp.Process]:
    return [p for p in mp.active_children() if p.name.startswith("cute-serve-tp")]


@pytest.fixture(scope="module", autouse=True)
def no_orphans():
    yield
    deadline = time.monotonic() + 10
    while tp_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tp_workers(), "tensor-parallel workers outlived their engines"


def tokens(engine, prompts, params) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in LLM.from_engine(engine).generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def kv4_pair():
    """One process and two ranks over the same random model with 4 KV heads (2 per rank), float32 caches: the
    seeded comparison is exact, and rounding K/V to bf16 turns the shards' last-bit differences into whole bf16
    steps (the default bf16 cache under TP is compared greedily in tests/runtime/kv/test_bf16_kv_cache.py)."""
    one, two = (tiny_engine(kv_heads=4, kv_cache_dtype="float32"),
                tiny_engine(kv_heads=4, tensor_parallel_size=2, kv_cache_dtype="float32"))
    yield one, two
    one.close()
    two.close()
    assert not any(p.is_alive() for p in two.runner.workers)


def test_tp2_greedy_tokens_equal_one_process(kv4_pair):
    one, two = kv4_pair
    assert tokens(two, PROMPTS, GREEDY) == tokens(one, PROMPTS, GREEDY)


def test_tp2_seeded_sampling_equals_one_process(kv4_pair):
    one, two = kv4_pair
    assert tokens(two, PROMPTS, SEEDED) == tokens(one, PROMPTS, SEEDED)


def test_tp2_ledger_counts_one_ranks_heads_and_weights(kv4_pair):
    one, two = kv4_pair
    assert two.ledger.bytes_per_token * 2 == one.ledger.bytes_per_token
    assert two.ledger.weight_bytes < 0.6 * one.ledger.weight_bytes  # norms are replicated, the rest halves
    assert two.ledger.describe().startswith("tensor parallel 2, per rank: ")
    assert two.describe()["tensor parallel"].startswith("2 ranks, ") and one.describe()["tensor parallel"] == "off"


def assert_same_until_a_near_tie(got: list[list[int]], want: list, tie: float = 0.01) -> None:
    """Greedy tokens equal the reference's up to the first step where its top two logprobs are within
    `tie`: there a different float summation order (a row-parallel shard sums half of K, then
    all-reduces) may pick the other one, and the sequences may part from then on."""
    for ids, out in zip(got, want):
        ref = out.outputs[0]
        for step, (token, (_, top)) in enumerate(zip(ids, ref.logprobs)):
            if len(top) > 1 and top[0][1] - top[1][1] < tie:
                break
            assert token == ref.token_ids[step], f"step {step}: {token} != {ref.token_ids[step]}, top-2 {top}"


@pytest.mark.parametrize("mode", ["int8", "q4"])
def test_quantized_linears_run_per_rank(mode):
    """Each rank quantizes its own shard with --quantization: tokens equal one quantized process's up to a near-tie (blocks of
    32 weights along the input are the same blocks whichever rank holds them; fp8's per-channel scales of a
    row-parallel shard are not, so fp8 under TP runs but computes on other scales)."""
    one, two = tiny_engine(kv_heads=4, quantization=mode), tiny_engine(kv_heads=4, quantization=mode,
                                                                     tensor_parallel_size=2)
    try:
        assert_same_until_a_near_tie(tokens(two, PROMPTS, GREEDY), LLM.from_engine(one).generate(
            PROMPTS, dataclasses.replace(GREEDY, logprobs=2), use_tqdm=False))
        # shards too narrow for the kernel's 32-wide blocks stay float on the tiny model; most are quantized
        assert two.ledger.quantization.startswith(f"{mode} x") and two.ledger.weight_bytes < one.ledger.weight_bytes
    finally:
        two.close()


def test_prefix_caching_preemption_and_ngram_speculation_under_tp():
    """KV heads replicated (1 KV head, 2 ranks), a pool small enough to preempt, shared prefixes,
    n-gram drafts, then a draft model: the tokens still match one process's."""
    prompts = mixed_prompts()[:5]  # two repetitive ones the n-gram proposer finds matches in
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    config = dict(kv_heads=1, num_blocks=12, speculative="ngram", max_num_seqs=4)
    one, two = tiny_engine(**config), tiny_engine(tensor_parallel_size=2, **config)
    try:
        assert two.model_runner.model.layers[0].cfg.num_kv_heads == 1  # each rank holds the one KV head
        assert tokens(two, prompts, params) == tokens(one, prompts, params)
        # the throttle prices drafts by measured step times, so how many are drafted may differ between
        # the two; each engine must still preempt, hit the prefix cache and accept drafts
        for stats in (one.stats, two.stats):
            assert stats.preemptions > 0 and stats.prefix_cache_hits > 0 and stats.spec_accepted > 0
        for engine in (one, two):  # a draft model (the target's own weights) runs on rank 0 alone
            cfg, weights = tiny_weights(num_key_value_heads=1)
            engine.set_proposer(draft_proposer(cfg, weights, engine.model_config, engine.config, engine.device,
                                                   engine.dtype, kv_budget_bytes=8 << 20))
            engine.reset_stats()
        assert tokens(two, prompts, params) == tokens(one, prompts, params)
        assert two.stats.spec_accepted == one.stats.spec_accepted > 0
    finally:
        one.close()
        two.close()


def test_killing_a_worker_mid_run_fails_the_server_with_503_not_a_hang():
    engine = tiny_engine(kv_heads=4, tensor_parallel_size=2)
    worker = engine.runner.workers[0]
    got: dict[str, object] = {}
    with live_server(engine) as srv:
        def stream() -> None:
            body = {"model": TINY_MODEL, "prompt": "x", "max_tokens": 900, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                got["text"] = "".join(r.iter_lines())

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 30
        while srv.async_engine.snapshot().generated_tokens < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGKILL)
        client.join(60)
        assert not client.is_alive(), "the stream hung after a worker died"
        assert "worker rank 1" in got["text"] and "SIGKILL" in got["text"]
        r = httpx.post(srv.url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "worker rank 1" in r.json()["error"]["message"]
        assert httpx.get(srv.url + "/health").status_code == 503
    assert engine.runner.closed and not any(p.is_alive() for p in engine.runner.workers)
    with pytest.raises(EngineDeadError, match="SIGKILL"):
        engine.runner.check_workers()


def test_a_worker_killed_while_idle_is_found_before_the_next_step():
    engine = tiny_engine(kv_heads=4, tensor_parallel_size=2)
    worker = engine.runner.workers[0]
    with live_server(engine) as srv:
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        health = httpx.get(srv.url + "/health")  # no request has come since: /health still finds out
        sent = httpx.post(srv.url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})
    for r in (health, sent):
        assert r.status_code == 503
        assert re.search(r"worker rank 1 \(pid \d+\) died \(killed by SIGKILL\)", r.json()["error"]["message"])
    assert not any(p.is_alive() for p in engine.runner.workers)
    with pytest.raises(EngineDeadError, match="closed"):  # the server's shutdown closed it
        LLM.from_engine(engine).generate(["hi"], GREEDY, use_tqdm=False)


# -- sizes and shards, no processes -------------------------------------------------------------

def test_sizes_that_do_not_split_are_user_errors_before_anything_is_built():
    workers = len(tp_workers())
    with pytest.raises(UserError, match="tensor_parallel_size must be a positive integer"):
        EngineConfig(tensor_parallel_size=0)
    cfg, _ = tiny_weights()  # 4 heads, 2 KV heads, MLP 96
    with pytest.raises(UserError, match="4 attention heads do not divide by 3"):
        check_tp_size(cfg, 3)
    cfg6 = dataclasses.replace(cfg, num_heads=6, num_kv_heads=3)
    with pytest.raises(UserError, match="3 KV heads neither divide by 2 nor divide it"):
        check_tp_size(cfg6, 2)
    with pytest.raises(UserError, match="4 attention heads"):
        tiny_engine(tensor_parallel_size=3)
    assert len(tp_workers()) == workers


def test_shards_reassemble_the_checkpoint_and_replicate_kv_heads():
    cfg, full = tiny_weights(num_key_value_heads=1)  # 4 query heads over 1 KV head, on 2 ranks
    parts = [shard_checkpoint(cfg, full, rank_shard(cfg, r, 2)) for r in range(2)]
    a = "model.layers.0.self_attn."
    assert torch.equal(torch.cat([p[a + "q_proj.weight"] for p in parts]), full[a + "q_proj.weight"])
    assert torch.equal(torch.cat([p[a + "o_proj.weight"] for p in parts], dim=1), full[a + "o_proj.weight"])
    assert all(torch.equal(p[a + "k_proj.weight"], full[a + "k_proj.weight"]) for p in parts)  # replicated
    m = "model.layers.1.mlp."
    assert torch.equal(torch.cat([p[m + "up_proj.weight"] for p in parts]), full[m + "up_proj.weight"])
    assert torch.equal(torch.cat([p[m + "down_proj.weight"] for p in parts], dim=1), full[m + "down_proj.weight"])
    local = local_config(cfg, rank_shard(cfg, 1, 2))
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (2, 1, 48)


def test_vocabulary_pads_to_a_multiple_of_the_ranks():
    cfg, full = tiny_weights()  # vocabulary 260 over 3 ranks: 87 rows each, the last 86 real + 1 zero row
    cfg = dataclasses.replace(cfg, num_heads=6, num_kv_heads=3)
    last = shard_checkpoint(cfg, {"lm_head.weight": full["lm_head.weight"]}, rank_shard(cfg, 2, 3))["lm_head.weight"]
    assert last.shape[0] == 87 and torch.equal(last[:86], full["lm_head.weight"][174:])
    assert not last[86:].any()


@pytest.mark.slow  # ~1 min on 2 shared cores: the real model loaded twice, three ranks started
@pytest.mark.parametrize("quantization", [None, "none"])
def test_tp3_on_the_default_model_matches_one_process(quantization):
    """SmolLM2-135M: 9 query heads and 3 KV heads, one KV head per rank; the GGUF's Q4_1/Q8_0 blocks are
    cut per rank (a third of the file's bytes each), or its float32 values with --quantization none."""
    from runtime.build import build_engine
    from runtime.load import load_model

    cfg, tensors, tok, _ = load_model(None)
    copy = {k: v.with_blocks(v.blocks.clone()) if hasattr(v, "blocks") else v.clone() for k, v in tensors.items()}
    config = dict(device="cpu", kv_cache_memory=32 << 20, log_ledger=False, quantization=quantization)
    prompts = [tok.encode("The three primary colors are"), tok.encode("def fibonacci(n):")]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with build_engine(EngineConfig(**config), cfg, tensors, tok) as one, \
            build_engine(EngineConfig(tensor_parallel_size=3, **config), cfg, copy, tok) as three:
        assert three.model_runner.model.layers[0].cfg.num_kv_heads == 1
        assert three.ledger.quantization == one.ledger.quantization
        if quantization is None:  # norms replicated, every block cut: a third of the file's bytes and a little
            assert one.ledger.quantization.startswith("Q4_1 x")
            assert three.ledger.weight_bytes < 0.36 * one.ledger.weight_bytes
        assert tokens(three, prompts, params) == tokens(one, prompts, params)


def test_llm_takes_the_size_and_its_deletion_stops_the_workers(tmp_path):
    import gc

    from tests.server_utils import write_tiny_model

    llm = LLM(model=write_tiny_model(str(tmp_path)), tensor_parallel_size=2, kv_cache_memory=1 << 20,
              log_ledger=False)
    workers = list(llm.engine.runner.workers)
    assert len(llm.generate(["hi"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 24
    del llm
    gc.collect()
    for p in workers:
        p.join(10)
    assert not any(p.is_alive() for p in workers)


def _children(pid: int) -> list[int]:
    """Live processes whose parent is pid (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow  # a server process with two ranks: ~40 s on 2 shared cores
def test_server_with_two_ranks_serves_and_its_shutdown_stops_the_worker(tmp_path):
    from profiling.benchmarks.bench_serving import start_server, stop_server
    from tests.server_utils import write_tiny_model

    log = tempfile.TemporaryFile("w+")
    proc, url = start_server(["--model", write_tiny_model(str(tmp_path)), "--tensor-parallel-size", "2",
                              "--kv-cache-memory", "8MiB", "--served-model-name", TINY_MODEL], log, timeout=300)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 4,
                                                       "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        workers = [pid for pid in _children(proc.pid) if b"spawn_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(workers) == 1
    finally:
        stop_server(proc)
    log.seek(0)
    assert proc.returncode == 0 and "tensor parallel 2, per rank: " in log.read()
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers)), "the server left a worker behind"


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: ~15-40 s on 2 shared cores
def test_a_process_that_exits_without_closing_leaves_no_worker():
    import subprocess
    import sys

    from tests.server_utils import REPO

    script = ("from tests.tiny_engine import tiny_engine\n"
              "engine = tiny_engine(kv_heads=4, tensor_parallel_size=2)\n"
              "print(engine.runner.workers[0].pid, flush=True)\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the worker outlived its process"
