"""litellm as its users point it at an OpenAI-compatible server ("openai/<model>" with api_base):
completion and its stream with usage, async streaming, a required tool, a pydantic response_format,
embedding, and responses()."""
import asyncio
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else its import fetches a price list over the network

import litellm  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from tests.runtime.server.clients.conftest import CITIES  # noqa: E402
from tests.runtime.server.clients.test_pydantic_ai import City  # noqa: E402

HI = [{"role": "user", "content": "hello"}]
FORECAST = {"type": "function", "function": {"name": "forecast", "parameters": {
    "type": "object", "properties": {"city": {"enum": CITIES}}, "required": ["city"]}}}


def kw(base_url: str, model: str, **more) -> dict:
    return {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused", "temperature": 0,
            "max_tokens": 8, **more}


def test_completion_and_its_streams_agree_with_usage(base_url, model):
    whole = litellm.completion(messages=HI, **kw(base_url, model))
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 8
    chunks = list(litellm.completion(messages=HI, stream=True, stream_options={"include_usage": True},
                                     **kw(base_url, model)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 8

    async def streamed() -> str:
        stream = await litellm.acompletion(messages=HI, stream=True, **kw(base_url, model))
        return "".join([c.choices[0].delta.content or "" async for c in stream])

    assert asyncio.run(streamed()) == whole.choices[0].message.content


def test_a_required_tool_and_a_pydantic_response_format(base_url, model):
    r = litellm.completion(messages=HI, tools=[FORECAST], tool_choice="required", parallel_tool_calls=False,
                           **kw(base_url, model, max_tokens=60)).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.tool_calls[0].function.name == "forecast"
    parsed = litellm.completion(messages=HI, response_format=City, **kw(base_url, model, max_tokens=80))
    assert isinstance(City.model_validate_json(parsed.choices[0].message.content), BaseModel)


def test_embedding_and_responses(base_url, model):
    e = litellm.embedding(model=f"openai/{model}", api_base=base_url, api_key="unused", input=["a", "b c"])
    assert len(e.data) == 2 and len(e.data[0]["embedding"]) == len(e.data[1]["embedding"]) > 0
    r = litellm.responses(model=f"openai/{model}", api_base=base_url, api_key="unused", input="hello",
                          max_output_tokens=16)  # OpenAI's least: litellm raises a smaller one to it
    assert r.status == "incomplete" and r.output[0].content[0].text and r.usage.output_tokens == 16
