"""vLLM-compatible extras over a real server on the tiny engine: cached-token usage, /tokenize and
/detokenize, chat template controls, include_stop_str_in_output."""
import httpx
import pytest

from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import BOS, CHATML, TINY_VOCAB, tiny_engine

LONG = "a fairly long prompt that fills three KV blocks!!"  # 48 byte tokens: 3 blocks of 16


def test_usage_reports_prompt_tokens_from_the_prefix_cache(client):
    kw = dict(model=TINY_MODEL, max_tokens=2, temperature=0)
    first = client.completions.create(prompt=LONG + " one", **kw).usage
    again = client.completions.create(prompt=LONG + " two", **kw).usage
    assert first.prompt_tokens_details.cached_tokens == 0
    assert again.prompt_tokens_details.cached_tokens == 48  # the three full blocks the prompts share
    chunks = list(client.completions.create(prompt=LONG + " six", stream=True,
                                            stream_options={"include_usage": True}, **kw))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 48
    chat = client.chat.completions.create(messages=[{"role": "user", "content": LONG}], **kw).usage
    assert chat.prompt_tokens_details.cached_tokens == 0  # the chat template puts other tokens first


# a template that reads a chat_template_kwargs variable, as Qwen3's reads enable_thinking
THINKING = CHATML.replace("<s>assistant\n{% endif %}",
                          "<s>assistant\n{% if enable_thinking is false %}<think></think>{% endif %}{% endif %}")


def tokenize(server, status=200, path="/tokenize", **body):
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()


def test_tokenize_and_detokenize_text(server):
    out = tokenize(server, prompt="hi there", return_token_strs=True)
    assert out["tokens"] == list(b"hi there") and out["count"] == 8  # the byte tokenizer adds no BOS
    assert out["max_model_len"] == server.async_engine.limits.max_model_len
    assert out["token_strs"][:2] == ["h", "i"]
    assert tokenize(server, prompt="<s>hi")["tokens"] == [BOS] + list(b"hi")  # special tokens typed in count
    assert tokenize(server, path="/detokenize", tokens=list(b"caf\xc3\xa9"))["prompt"] == "café"


def test_tokenize_messages_matches_what_chat_completions_prompts(server, client):
    messages = [{"role": "user", "content": "hello"}]
    out = tokenize(server, messages=messages)
    assert out["tokens"] == server.engine.tokenizer.encode("<s>user\nhello</s>\n<s>assistant\n", False)
    usage = client.chat.completions.create(model=TINY_MODEL, messages=messages, max_tokens=1).usage
    assert usage.prompt_tokens == out["count"]
    closed = tokenize(server, messages=messages, add_generation_prompt=False)["tokens"]
    assert closed == server.engine.tokenizer.encode("<s>user\nhello</s>\n", False)


def test_continue_final_message_leaves_the_assistant_turn_open(server):
    messages = [{"role": "user", "content": "tell a story"}, {"role": "assistant", "content": "Once upon"}]
    out = tokenize(server, messages=messages, add_generation_prompt=False, continue_final_message=True)
    assert server.engine.tokenizer.decode(out["tokens"]).endswith("<s>assistant\nOnce upon")
    both = tokenize(server, 400, messages=messages, continue_final_message=True)
    assert both["error"]["param"] == "continue_final_message"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": messages, "continue_final_message": True, "max_tokens": 1})
    assert r.status_code == 400 and "cannot both be true" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, param", [({}, "prompt"), ({"prompt": "a", "messages": [{"role": "user"}]}, "prompt"),
                                         ({"prompt": 3}, "prompt"), ({"prompt": "a", "model": "other"}, "model")])
def test_tokenize_refuses_bad_input_with_a_400(server, body, param):
    r = httpx.post(server.url + "/tokenize", json=body, timeout=60)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


def test_detokenize_refuses_ids_outside_the_vocabulary(server):
    out = tokenize(server, 400, path="/detokenize", tokens=[1, TINY_VOCAB])
    assert "not in [0, 260)" in out["error"]["message"]
    assert tokenize(server, 400, path="/detokenize", tokens="abc")["error"]["param"] == "tokens"


def test_chat_template_kwargs_reach_the_template():
    with live_server(tiny_engine(chat_template=THINKING)) as srv:
        messages = [{"role": "user", "content": "hi"}]
        plain = tokenize(srv, messages=messages)["tokens"]
        off = tokenize(srv, messages=messages, chat_template_kwargs={"enable_thinking": False})["tokens"]
        assert srv.engine.tokenizer.decode(off) == srv.engine.tokenizer.decode(plain) + "<think></think>"
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": messages, "max_tokens": 1, "chat_template_kwargs": {"enable_thinking": False}})
        assert r.json()["usage"]["prompt_tokens"] == len(off)
        bad = tokenize(srv, 400, messages=messages, chat_template_kwargs={"messages": []})
        assert bad["error"]["param"] == "chat_template_kwargs"


def test_tokenize_wants_the_api_key():
    with live_server(tiny_engine(), api_key="sesame") as srv:
        assert httpx.post(srv.url + "/tokenize", json={"prompt": "a"}).status_code == 401
        ok = httpx.post(srv.url + "/detokenize", json={"tokens": [104]}, headers={"Authorization": "Bearer sesame"})
        assert ok.json() == {"prompt": "h"}


def test_include_stop_str_in_output_offline_and_served_streamed_or_not(server, client):
    forced = {ord("x"): 100.0}  # every token is "x": the stop string "xxx" ends the third
    params = SamplingParams(temperature=0, max_tokens=10, stop=["xxx"], logit_bias=forced,
                            include_stop_str_in_output=True)
    out = LLM.from_engine(tiny_engine()).generate(["abc"], params, use_tqdm=False)[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == ("xxx", "stop", "xxx")
    kw = dict(model=TINY_MODEL, prompt="abc", max_tokens=10, stop="xxx", logit_bias={str(ord("x")): 100})
    kept = client.completions.create(**kw, extra_body={"include_stop_str_in_output": True}).choices[0]
    assert (kept.text, kept.finish_reason) == ("xxx", "stop")
    assert client.completions.create(**kw).choices[0].text == ""
    chunks = client.completions.create(**kw, stream=True, extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].text for c in chunks) == "xxx"
    chat = client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10,
                                          stop="xxx", logit_bias={str(ord("x")): 100},
                                          extra_body={"include_stop_str_in_output": True})
    assert chat.choices[0].message.content == "xxx"
