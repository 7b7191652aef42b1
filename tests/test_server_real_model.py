"""The real default model (SmolLM2-135M-Instruct) behind `python -m runtime.serve`, via the openai client."""
import openai

from tests.server_utils import serve_subprocess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_openai_client_chat_says_paris_streamed_and_not():
    with serve_subprocess("--kv-cache-memory", "64MiB", timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24)
        assert "Paris" in r.choices[0].message.content
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 24
        stream = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24,
                                                stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == r.choices[0].message.content
