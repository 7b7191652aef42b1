"""vLLM-compatible extras over a real server on the tiny engine: cached-token usage, /tokenize and
/detokenize, include_stop_str_in_output, chat template controls."""
import httpx
import openai
import pytest

from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import tiny_engine

LONG = "a fairly long prompt that fills three KV blocks!!"  # 48 byte tokens: 3 blocks of 16


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine()) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


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
