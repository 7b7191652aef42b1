"""A model folder's generation_config.json sampling defaults: read, checked at load, applied where a
request or call sets none (offline and served), ignored with --generation-config vllm; --chat-template."""
import json
import os

import httpx
import pytest

from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from runtime.server.openai.prepare import sampling_params
from runtime.server.openai.protocol import ChatCompletionRequest
from runtime.tokenizer.template_source import load_chat_template
from tests.server_utils import openai_client, serve_subprocess, write_tiny_model
from weights.generation_defaults import generation_defaults

RECOMMENDED = {"temperature": 0.0, "top_k": 20, "max_new_tokens": 3, "do_sample": True, "eos_token_id": 257}
SMALL = dict(kv_cache_memory=4 << 20, device="cpu")


def with_generation_config(folder: str, config: dict) -> str:
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(config, f)
    return folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return with_generation_config(write_tiny_model(str(tmp_path_factory.mktemp("tiny"))), RECOMMENDED)


def test_the_sampling_keys_are_read_under_sampling_params_names(model_dir, tmp_path):
    assert generation_defaults(model_dir) == {"temperature": 0.0, "top_k": 20, "max_tokens": 3}
    assert generation_defaults(str(tmp_path)) == {} and generation_defaults(str(tmp_path / "x.gguf")) == {}
    with_generation_config(str(tmp_path), {"top_p": "high"})
    with pytest.raises(UserError, match="top_p is 'high', not a number"):
        generation_defaults(str(tmp_path))


def test_offline_calls_without_params_use_the_models_defaults(model_dir):
    llm = LLM(model=model_dir, **SMALL)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=20, max_tokens=3)
    plain = llm.generate(["hello"], use_tqdm=False)[0].outputs[0]
    same = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].outputs[0]
    assert plain.token_ids == same.token_ids and len(plain.token_ids) <= 3
    assert LLM(model=model_dir, generation_config="vllm", **SMALL).get_default_sampling_params() == SamplingParams()


def test_a_default_the_engine_would_refuse_fails_the_load(tmp_path):
    folder = with_generation_config(write_tiny_model(str(tmp_path)), {"temperature": -1})
    with pytest.raises(UserError, match="generation_config.json.*temperature"):
        LLM(model=folder, **SMALL)


def test_requests_keep_what_they_set_and_take_the_rest():
    defaults = {"temperature": 0.6, "top_p": 0.9, "max_tokens": 50}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=1.0)
    p = sampling_params(req, 1024, None, defaults)
    assert (p.temperature, p.top_p, p.max_tokens) == (1.0, 0.9, 50)
    p = sampling_params(req, 20, None, defaults)  # the server's cap still holds
    assert p.max_tokens == 20
    p = sampling_params(req.model_copy(update={"max_tokens": 99}), 1024, None, defaults)
    assert p.max_tokens == 99


def test_serve_applies_and_logs_the_defaults_and_takes_a_chat_template(model_dir, tmp_path):
    template = tmp_path / "plain.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    with serve_subprocess("--model", model_dir, "--kv-cache-memory", "8MiB", "--served-model-name", "tiny",
                          "--chat-template", str(template), timeout=120) as (url, log):
        client = openai_client(url)
        r = client.completions.create(model="tiny", prompt="hi", extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3  # max_new_tokens
        assert client.completions.create(model="tiny", prompt="hi", max_tokens=5,
                                         extra_body={"ignore_eos": True}).usage.completion_tokens == 5
        tokens = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "yo"}]}).json()
        assert tokens["count"] == len(b"[user] yo\n")
        startup = log()
    assert "sampling defaults from generation_config.json" in startup and "max_tokens=3" in startup


def test_chat_template_flag_takes_a_file_or_the_text_and_refuses_anything_else(tmp_path):
    inline = "{{ messages[0]['content'] }}"
    assert load_chat_template(inline) == inline
    (tmp_path / "t.jinja").write_text(inline)
    assert load_chat_template(str(tmp_path / "t.jinja")) == inline
    with pytest.raises(UserError, match="no such file"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(UserError, match="chat template is invalid"):
        load_chat_template("{% for m in messages %}")
