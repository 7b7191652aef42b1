"""Pipeline parallelism on the CPU (gloo), spawned stages: the same tokens as one process, alone and
under TP, each stage's bytes in the ledger, sizes that cannot split, and a stage that dies mid-stream."""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import httpx
import pytest

from runtime.errors import UserError
from runtime.parallel.layers import COMM
from runtime.parallel.pipeline import split_micro_batches
from runtime.parallel.plan import Layout
from runtime.parallel.shard import stage_checkpoint
from runtime.sampling_params import SamplingParams
from runtime.sequence import SeqChunk
from tests.runtime.parallel.test_tensor_parallel import GREEDY, PROMPTS, tokens, tp_workers
from tests.runtime.spec.test_spec import mixed_prompts
from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine, tiny_weights

SMALL_POOL = dict(kv_heads=4, num_blocks=12, max_num_seqs=4)  # preempts, and shares prefixes


@pytest.fixture(scope="module", autouse=True)
def no_orphans():
    yield
    deadline = time.monotonic() + 10
    while tp_workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tp_workers(), "pipeline stages outlived their engines"


@pytest.fixture(scope="module")
def one():
    engine = tiny_engine(**SMALL_POOL)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def pp2():
    engine = tiny_engine(pipeline_parallel_size=2, **SMALL_POOL)
    yield engine
    engine.close()
    assert not any(p.is_alive() for p in engine.runner.workers)


def test_pp2_greedy_tokens_equal_one_process_through_preemption_and_prefix_hits(one, pp2):
    prompts = mixed_prompts()[:5]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    COMM.reset()
    assert tokens(pp2, prompts, params) == tokens(one, prompts, params)
    assert pp2.stats.preemptions == one.stats.preemptions > 0
    assert pp2.stats.prefix_cache_hits == one.stats.prefix_cache_hits > 0
    assert COMM.bubble_seconds > 0 and COMM.p2p_seconds > 0  # rank 0 waited for the last stage's logits


def test_each_stage_holds_its_layers_and_the_ledger_names_their_bytes(one, pp2):
    (w0, kv0), (w1, kv1) = pp2.ledger.stage_bytes
    assert kv0 == kv1 == one.ledger.total_bytes // 2  # one layer's KV each, the same blocks
    hidden_norm = pp2.model_config.hidden_size * 4  # the final norm, kept by stage 0 too
    assert w0 + w1 == one.ledger.weight_bytes + hidden_norm  # the embedding on stage 0, the head on stage 1
    assert len(pp2.model_runner.model.layers) == 1 and pp2.model_runner.model.head.weight_bytes() == 0
    ledger = pp2.describe()["memory ledger"]
    assert ledger.startswith("pipeline 2 stages, per rank of each: stage 0: weights ") and "stage 1: weights" in ledger
    assert pp2.describe()["tensor parallel"].startswith("TP 1 x PP 2 (2 ranks")


def test_tp2_by_pp2_greedy_tokens_equal_one_process():
    one, four = tiny_engine(kv_heads=4), tiny_engine(kv_heads=4, tensor_parallel_size=2, pipeline_parallel_size=2)
    try:
        assert len(four.runner.workers) == 3
        assert tokens(four, PROMPTS, GREEDY) == tokens(one, PROMPTS, GREEDY)
        assert four.ledger.describe().count("stage ") == 2 and "tensor parallel 2, per rank" in four.ledger.describe()
    finally:
        one.close()
        four.close()


# -- layouts and cuts, no processes ---------------------------------------------------------------

def test_a_stage_count_the_layers_cannot_take_is_a_user_error_before_anything_starts():
    workers = len(tp_workers())
    with pytest.raises(UserError, match="pipeline_parallel_size must be a positive integer"):
        tiny_engine(pipeline_parallel_size=0)
    with pytest.raises(UserError, match=r"--pipeline-parallel-size 3 does not fit .*2 layers cannot give each of 3"):
        tiny_engine(pipeline_parallel_size=3)
    with pytest.raises(UserError, match="--tensor-parallel-size 3 does not fit"):
        tiny_engine(tensor_parallel_size=3, pipeline_parallel_size=2)
    with pytest.raises(UserError, match="--speculative medusa reads the final hidden states"):
        tiny_engine(pipeline_parallel_size=2, speculative="medusa")
    assert len(tp_workers()) == workers


def test_layers_split_evenly_the_first_stages_taking_the_rest():
    cfg, full = tiny_weights()
    cfg7 = dataclasses.replace(cfg, num_layers=7)
    layout = Layout(tp=2, pp=3)
    assert [layout.layers(cfg7, s) for s in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [(layout.stage(r), layout.tp_rank(r)) for r in range(6)] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    second = stage_checkpoint(full, (1, 2))
    assert second["model.layers.0.mlp.up_proj.weight"] is full["model.layers.1.mlp.up_proj.weight"]
    assert not any(k.startswith("model.layers.1.") for k in second) and "lm_head.weight" in second


def test_micro_batches_are_consecutive_chunks_of_about_equal_tokens():
    chunks = [SeqChunk(list(range(n)), 0, [0], 1, seq_id=i) for i, n in enumerate([100, 1, 1, 1, 90, 8])]
    parts = split_micro_batches(chunks, 2)
    assert [[c.seq_id for c in p] for p in parts] == [[0], [1, 2, 3, 4, 5]]
    assert sum(parts, []) == chunks
    assert split_micro_batches(chunks[:1], 4) == [chunks[:1]]
    assert [len(p) for p in split_micro_batches(chunks[4:], 2)] == [1, 1]  # one chunk past the half: still two
    assert len(split_micro_batches(chunks, 4)) <= 4 and sum(split_micro_batches(chunks, 4), []) == chunks


def test_a_stage_killed_mid_stream_fails_the_server_with_503_not_a_hang(pp2):
    """Last in the module: it ends the shared engine."""
    engine = pp2
    stage1 = engine.runner.workers[0]
    got: dict[str, str] = {}
    with live_server(engine) as srv:
        def stream() -> None:
            body = {"model": TINY_MODEL, "prompt": "x", "max_tokens": 190, "ignore_eos": True, "stream": True}  # the pool: 192
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                got["text"] = "".join(r.iter_lines())

        client = threading.Thread(target=stream)
        client.start()
        deadline = time.monotonic() + 30
        while srv.async_engine.snapshot().generated_tokens < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        os.kill(stage1.pid, signal.SIGKILL)
        client.join(30)
        assert not client.is_alive(), "the stream hung after a stage died"
        assert time.monotonic() - t0 < 10
        assert "worker rank 1" in got["text"] and "SIGKILL" in got["text"] and "engine_unavailable" in got["text"]
        r = httpx.post(srv.url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "worker rank 1" in r.json()["error"]["message"]
    assert engine.runner.closed and not stage1.is_alive()
