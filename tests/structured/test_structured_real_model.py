"""Structured output and tool calls on the real default model (SmolLM2-135M-Instruct) behind
`python -m runtime.serve`, through the official openai client."""
import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pydantic
import pytest

from tests.server_utils import serve_subprocess

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 40},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web",
                                           "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60}},
                                                          "required": ["query"]}}}
TOPICS = ["Paris", "the moon", "cats", "the stock market", "Oslo", "pizza", "quantum physics", "football", "Tokyo",
          "gardening", "the weather tomorrow", "Python", "jazz", "Mount Everest", "coffee", "Berlin", "rain",
          "dinosaurs", "the ocean", "chess"]
PROMPTS = [f"{verb} {topic}" for verb in ("Tell me about", "What's the weather like in") for topic in TOPICS] + \
    [f"Search the web for {topic}" for topic in TOPICS[::2]]  # 50 in all


class City(pydantic.BaseModel):  # bounded strings: a 135M model left free may repeat itself inside one
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population: int = pydantic.Field(ge=0, le=100_000_000)


def test_parse_and_required_tool_calls_on_the_default_model():
    with serve_subprocess("--kv-cache-memory", "256MiB", timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        r = client.beta.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "Describe Paris as JSON."}], temperature=0,
            max_tokens=120, response_format=City)
        assert isinstance(r.choices[0].message.parsed, City), r.choices[0].message.content

        def call(prompt: str):
            return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                  tools=[WEATHER, SEARCH], tool_choice="required", temperature=0,
                                                  parallel_tool_calls=False,
                                                  max_tokens=96).choices[0]

        assert len(PROMPTS) == 50
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # one batch
            choices = list(pool.map(call, PROMPTS))
        for prompt, choice in zip(PROMPTS, choices):
            assert choice.finish_reason == "tool_calls", (prompt, choice)
            for tc in choice.message.tool_calls:
                args = json.loads(tc.function.arguments)
                assert tc.function.name in ("get_weather", "search")
                assert set(args) == ({"city", "unit"} if tc.function.name == "get_weather" else {"query"})


class Reasoned(pydantic.BaseModel):  # the order a client writes is the order it means
    reasoning: str = pydantic.Field(max_length=80)
    answer: int


def test_schemas_and_required_tools_keep_the_clients_key_order_on_the_default_model():
    with serve_subprocess("--kv-cache-memory", "256MiB", timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        r = client.beta.chat.completions.parse(
            model=model, messages=[{"role": "user", "content": "What is 2 + 2? Think, then answer."}],
            temperature=0, max_tokens=120, response_format=Reasoned)
        content = r.choices[0].message.content
        assert isinstance(r.choices[0].message.parsed, Reasoned), content
        assert list(json.loads(content)) == ["reasoning", "answer"], content
        # parallel calls allowed: written name first, the model closes the list after one call
        choice = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Search the web for jazz"}], tools=[WEATHER, SEARCH],
            tool_choice="required", temperature=0, max_tokens=200).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        assert [c.function.name for c in choice.message.tool_calls] == ["search"]
        # cut by max_tokens one token before the list closes: the calls written whole are kept. One call,
        # so the grammar closes the list: left to the model, whether it stops after one or repeats itself
        # to max_tokens turns on rounding (a prefix-cache hit moves the rows to another kernel)
        ask = dict(model=model, messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
                   tools=[WEATHER, SEARCH], tool_choice="required", parallel_tool_calls=False, temperature=0)
        whole = client.chat.completions.create(**ask, max_tokens=200)
        assert whole.choices[0].finish_reason == "tool_calls", whole
        cut = client.chat.completions.create(**ask, max_tokens=whole.usage.completion_tokens - 1).choices[0]
        assert cut.finish_reason == "length" and cut.message.content is None and cut.message.tool_calls, cut
        kept = [(c.function.name, c.function.arguments) for c in cut.message.tool_calls]
        assert kept == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls][:len(kept)]
        keys = {"get_weather": {"city", "unit"}, "search": {"query"}}  # whichever tool the model chose
        assert all(set(json.loads(c.function.arguments)) == keys[c.function.name] for c in cut.message.tool_calls)
