"""What clients do first, on the real default model behind `python -m runtime.serve` (float weights,
one server for the module): the answers are asserted, through the openai client, langchain-openai,
pydantic-ai, openai-agents on its default Responses path, litellm and instructor (in its own interpreter)."""
import asyncio
import json
import os

import numpy as np
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider as PydanticProvider

from tests.runtime.server.clients.test_instructor import run_instructor
from tests.server_utils import serve_subprocess

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm  # noqa: E402

pytestmark = pytest.mark.slow

SEARCH = {"type": "function", "name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60}},
                         "required": ["query"], "additionalProperties": False}}
CAPITAL = "What is the capital of France?"
ALICE = "Alice is 30 years old. Extract her name and age."
TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]


class Person(BaseModel):  # bounded: a 135M model left free may repeat itself inside a string
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def served():
    # float weights: the quantized default tips the capital prompt's near-tie first token (test_server_real_model)
    with serve_subprocess("--kv-cache-memory", "256MiB", "--quantization", "none", timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        yield url + "/v1", client.models.list().data[0].id, client


def test_embeddings_and_a_responses_function_call(served):
    base_url, model, client = served
    assert client.models.retrieve(model).id == model
    e = np.array([d.embedding for d in client.embeddings.create(model=model, input=TEXTS).data])
    assert np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2]  # the cat is nearer the kitten than the stock market

    kw = dict(model=model, input="Search the web for jazz", tools=[SEARCH], tool_choice="required",
              temperature=0, max_output_tokens=100)
    r = client.responses.create(**kw)
    call = r.output[-1]
    assert r.status == "completed" and call.type == "function_call" and call.name == "search", r
    assert set(json.loads(call.arguments)) == {"query"}
    with client.responses.stream(**kw) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == final.output[-1].arguments == call.arguments


def test_langchain_answers_extracts_and_ranks(served):
    base_url, model, _ = served
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=24, max_retries=0)
    assert "Paris" in llm.invoke(CAPITAL).content
    person = llm.with_structured_output(Person).invoke(ALICE)
    assert person.name == "Alice" and person.age == 30
    emb = OpenAIEmbeddings(model=model, base_url=base_url, api_key="unused", check_embedding_ctx_length=False)
    cat, kitten, stocks = np.array(emb.embed_documents(TEXTS))
    assert cat @ kitten > cat @ stocks


def test_pydantic_ai_structured_output(served):
    base_url, model, _ = served
    chat = OpenAIChatModel(model, provider=PydanticProvider(base_url=base_url, api_key="unused"))
    settings = {"temperature": 0, "max_tokens": 60}
    # its default: a required final_result tool (the 135M model copies that tool name into "name"; the age is read)
    assert PydanticAgent(chat, output_type=Person, model_settings=settings).run_sync(ALICE).output.age == 30
    person = PydanticAgent(chat, output_type=NativeOutput(Person), model_settings=settings).run_sync(ALICE).output
    assert person.name == "Alice" and person.age == 30  # json_schema response_format


def test_openai_agents_calls_the_tool_with_the_city_asked_for(served):
    base_url, model, _ = served
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return "sunny"

    agent = Agent(name="weather", instructions="Answer with the get_weather tool.", tools=[get_weather], model=model,
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                               max_tokens=60))
    config = RunConfig(model_provider=OpenAIProvider(
        openai_client=openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)), tracing_disabled=True)
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", run_config=config))
    assert result.final_output == "sunny" and cities == ["Paris"]


def test_litellm_answers(served):
    base_url, model, _ = served
    r = litellm.completion(model=f"openai/{model}", api_base=base_url, api_key="unused", temperature=0,
                           max_tokens=24, messages=[{"role": "user", "content": CAPITAL}])
    assert "Paris" in r.choices[0].message.content


def test_instructor_extracts_a_person_in_both_modes(served):
    base_url, model, _ = served
    for mode, person in run_instructor(base_url, model, "person", timeout=300).items():
        assert person["name"] == "Alice" and person["age"] == 30, (mode, person)
