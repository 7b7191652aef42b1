"""POST /v1/embeddings: the model's final hidden states pooled per input (checked against transformers'
own), batched without touching generation's KV, in OpenAI's shape through the openai client."""
import base64
import json
import threading

import httpx
import numpy as np
import openai
import pytest
import torch

from runtime.server.openai.pooling import embed
from tests.hf_tiny import tiny_hf_model
from tests.server_utils import TINY_MODEL, live_server, openai_client
from tests.tiny_engine import TINY_VOCAB, tiny_engine

PROMPTS = [[72, 101, 108, 108, 111] * 7, [65], list(range(97, 120)), [66, 67]]


def hf_states(hf, ids: list[int], pooling: str) -> torch.Tensor:
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].float()
    return states.mean(0) if pooling == "mean" else states[-1]


def test_pooled_hidden_states_equal_transformers_last_hidden_state_batched_or_alone():
    engine = tiny_engine(kv_cache_dtype="float32")  # transformers attends in float32: so does this cache
    hf = tiny_hf_model("llama", seed=0, vocab_size=TINY_VOCAB, max_position_embeddings=1024).eval()
    blocks_before = engine.snapshot().kv_blocks_used
    for pooling in ("mean", "last"):
        batched = embed(engine.model_runner, PROMPTS, pooling, normalize=False, max_batch_tokens=40)
        for ids, got in zip(PROMPTS, batched):
            torch.testing.assert_close(got, hf_states(hf, ids, pooling), rtol=1e-4, atol=1e-4)
            alone = embed(engine.model_runner, [ids], pooling, normalize=False)[0]
            torch.testing.assert_close(alone, got, rtol=1e-5, atol=1e-5)
    unit = embed(engine.model_runner, PROMPTS)
    assert all(abs(float(v.norm()) - 1) < 1e-5 for v in unit)
    assert engine.snapshot().kv_blocks_used == blocks_before  # scratch blocks only


def test_pooled_hidden_states_from_the_default_bf16_cache_stay_near_transformers():
    """The CPU's default cache rounds K and V to bf16 (8 mantissa bits, relative step 2^-8): the tiny model's
    hidden states (unit-scale, 2 layers) move by at most ~5e-3, and two tokens swapped in the prompt
    move them by more than 1."""
    engine = tiny_engine()
    hf = tiny_hf_model("llama", seed=0, vocab_size=TINY_VOCAB, max_position_embeddings=1024).eval()
    for pooling in ("mean", "last"):
        for ids, got in zip(PROMPTS, embed(engine.model_runner, PROMPTS, pooling, normalize=False)):
            torch.testing.assert_close(got, hf_states(hf, ids, pooling), rtol=0, atol=2e-2)


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(num_blocks=64)) as srv:
        yield srv


def test_embeddings_in_every_input_shape_through_the_openai_client(server):
    client = openai_client(server.url)
    hidden = server.engine.model_config.hidden_size
    one = client.embeddings.create(model=TINY_MODEL, input="Hello there")  # the SDK asks for base64 by default
    assert len(one.data) == 1 and len(one.data[0].embedding) == hidden
    assert abs(np.linalg.norm(one.data[0].embedding) - 1) < 1e-5
    floats = client.embeddings.create(model=TINY_MODEL, input="Hello there", encoding_format="float",
                                      dimensions=hidden)
    assert np.allclose(floats.data[0].embedding, one.data[0].embedding, atol=1e-6)
    assert one.usage.prompt_tokens == one.usage.total_tokens == len("Hello there")
    many = client.embeddings.create(model=TINY_MODEL, input=["Hello there", "x", "other text"])
    assert [d.index for d in many.data] == [0, 1, 2]
    assert np.allclose(many.data[0].embedding, one.data[0].embedding, atol=1e-5)
    ids = client.embeddings.create(model=TINY_MODEL, input=list(b"Hello there"), encoding_format="float")
    assert np.allclose(ids.data[0].embedding, one.data[0].embedding, atol=1e-5)
    lists = client.embeddings.create(model=TINY_MODEL, input=[list(b"x"), list(b"other text")])
    assert np.allclose([d.embedding for d in lists.data], [d.embedding for d in many.data[1:]], atol=1e-5)
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "encoding_format": "base64"}).json()
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    assert np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4").shape == (hidden,)


@pytest.mark.parametrize("body, param", [({"input": "x", "dimensions": 3}, "dimensions"),
                                         ({"input": []}, "input"), ({"input": [TINY_VOCAB + 5]}, "input"),
                                         ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                                         ({"input": "x" * 5000}, "input")])
def test_bad_embedding_requests_are_400s_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    with pytest.raises(openai.NotFoundError):
        openai_client(server.url).embeddings.create(model="text-embedding-3-small", input="x")


def test_embeddings_between_steps_leave_a_running_generation_unchanged(server):
    body = {"model": TINY_MODEL, "prompt": "a long enough prompt to span blocks" * 2, "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}
    want = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    got = []

    def generate():
        with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            got.extend(json.loads(line[6:])["choices"][0]["text"] for line in r.iter_lines()
                       if line.startswith("data: {") and '"choices":[{' in line)

    thread = threading.Thread(target=generate)
    thread.start()
    for _ in range(10):
        httpx.post(server.url + "/v1/embeddings", json={"input": ["embedding text " * 20, "more"]}, timeout=60)
    thread.join()
    assert "".join(got) == want
    server.wait_idle()
