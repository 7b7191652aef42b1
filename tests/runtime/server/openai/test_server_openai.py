"""The official openai client, unchanged, against a real uvicorn server over the tiny engine."""
import json

import httpx
import openai
import pytest

from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.server_utils import TINY_MODEL, sse_payloads
from tests.tiny_engine import tiny_engine

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def reference():
    """The same weights offline: what the server must answer at temperature 0."""
    return LLM.from_engine(tiny_engine())


def test_models_lists_the_served_model(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == [TINY_MODEL]
    assert models[0].object == "model"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_one_model_by_its_id_and_404_for_another(client, server):
    model = client.models.retrieve(TINY_MODEL)
    assert (model.id, model.object) == (TINY_MODEL, "model")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.body["code"] == "model_not_found" and "gpt-4o" in err.value.body["message"]
    r = httpx.get(server.url + "/v1/models/org/name")  # a name with a slash is one id, unknown here
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_chat_matches_offline_engine_with_usage(client, reference):
    r = client.chat.completions.create(model=TINY_MODEL, messages=CHAT, max_tokens=12, temperature=0)
    want = reference.chat(CHAT, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == want.outputs[0].text
    assert choice.finish_reason == want.outputs[0].finish_reason
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)
    assert r.usage.completion_tokens == len(want.outputs[0].token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.object == "chat.completion" and r.model == TINY_MODEL


def test_chat_stream_equals_non_stream_and_ends_properly(client):
    kw = dict(model=TINY_MODEL, messages=CHAT, max_completion_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == "length"
    assert not final[0].choices[0].delta.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_framing_ends_with_done(server):
    body = {"model": TINY_MODEL, "messages": CHAT, "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        payloads = list(sse_payloads(r.iter_lines()))
    assert payloads[-1] == "[DONE]"
    last = json.loads(payloads[-2])
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"


def test_completions_prompt_forms_batch_n_and_echo(client, reference):
    ids = [72, 101, 108, 108, 111]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = {tuple(p): o.outputs[0].text for p, o in
            zip([ids, [120, 121]], reference.generate([ids, [120, 121]], params, use_tqdm=False))}
    as_text = client.completions.create(model=TINY_MODEL, prompt="Hello", max_tokens=6, temperature=0,
                                        extra_body={"ignore_eos": True})
    as_ids = client.completions.create(model=TINY_MODEL, prompt=ids, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert as_text.choices[0].text == as_ids.choices[0].text == want[tuple(ids)]
    assert as_text.usage.prompt_tokens == 5 and as_text.usage.completion_tokens == 6

    batch = client.completions.create(model=TINY_MODEL, prompt=["Hello", "xy"], n=2, max_tokens=6, temperature=0,
                                      echo=True, extra_body={"ignore_eos": True})
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == ["Hello" + want[tuple(ids)]] * 2 + ["xy" + want[(120, 121)]] * 2
    assert batch.usage.prompt_tokens == 7 and batch.usage.completion_tokens == 24


def test_completion_stream_with_logprobs_and_usage(client):
    kw = dict(model=TINY_MODEL, prompt="abc", max_tokens=8, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0]
    assert len(whole.logprobs.tokens) == 8 and len(whole.logprobs.top_logprobs) == 8
    assert all(len(top) <= 2 for top in whole.logprobs.top_logprobs)
    assert all(lp <= 0 for lp in whole.logprobs.token_logprobs)
    chunks = list(client.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.text for c in streamed) == whole.text
    tokens = [t for c in streamed if c.logprobs for t in c.logprobs.tokens]
    assert tokens == whole.logprobs.tokens
    assert streamed[-1].finish_reason == "length" and streamed[-1].text == ""
    assert chunks[-1].usage.completion_tokens == 8
    # logprobs=0: the chosen tokens' logprobs, no alternatives
    zero = client.completions.create(**{**kw, "logprobs": 0}).choices[0].logprobs
    assert len(zero.token_logprobs) == 8 and zero.top_logprobs == [{}] * 8


def test_stop_string_seed_and_default_max_tokens(client, server):
    base = client.completions.create(model=TINY_MODEL, prompt="abc", max_tokens=10, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = next(base[i:i + 2] for i in range(2, 8) if base[i:i + 2].isprintable())
    cut = client.completions.create(model=TINY_MODEL, prompt="abc", max_tokens=10, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop" and cut.text == base[:base.index(stop)]
    assert cut.stop_reason == stop
    forced = client.completions.create(model=TINY_MODEL, prompt="abc", max_tokens=10, temperature=0, stop="xx",
                                       logit_bias={str(ord("x")): 100}).choices[0]
    assert forced.finish_reason == "stop" and forced.text == ""
    seeded = [client.completions.create(model=TINY_MODEL, prompt="abc", max_tokens=10, temperature=1.0, seed=42,
                                        extra_body={"ignore_eos": True}).choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]
    # no max_tokens: the room left in the context (under the --default-max-tokens cap)
    ctx = server.engine.max_model_len
    r = client.completions.create(model=TINY_MODEL, prompt=[65] * (ctx - 7), temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 7
    server.wait_idle()
