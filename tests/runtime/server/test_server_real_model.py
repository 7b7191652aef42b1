"""The real default model (SmolLM2-135M-Instruct) behind `python -m runtime.serve`, via the openai client,
one server for the module (loading it is the cost)."""
import openai
import pytest

from tests.runtime.server.openai.logprob_checks import check_chat, check_completion
from tests.server_utils import serve_subprocess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
EMOJI = "Reply only with emoji: 😀🎉🚀🔥🍕 Now repeat them 5 times."  # the repro


@pytest.fixture(scope="module")
def client():
    # float weights, as test_cli's Paris check: the quantized default tips this prompt's near-tie first token
    with serve_subprocess("--kv-cache-memory", "64MiB", "--quantization", "none", timeout=600) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_client_chat_says_paris_streamed_and_not(client):
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 24
    stream = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=24,
                                            stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == r.choices[0].message.content


def test_emoji_logprobs_are_byte_exact(client):
    """Emoji span several byte-level tokens: each shows its own bytes, and they add up to the text."""
    model = client.models.list().data[0].id
    c = client.completions.create(model=model, prompt=EMOJI, max_tokens=8, temperature=0, logprobs=5).choices[0]
    assert any(t.startswith("bytes:") for t in c.logprobs.tokens) and "\ufffd" not in c.text
    check_completion(c.text, c.logprobs.model_dump(), 5)
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": EMOJI}], max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=5).choices[0]
    assert all(t.bytes != [239, 191, 189] for t in r.logprobs.content) and "\ufffd" not in r.message.content
    check_chat(r.message.content, r.logprobs.model_dump(), 5)
