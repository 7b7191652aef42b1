"""pydantic-ai as its users start: an Agent with a structured output_type (a required final_result
tool, its default), plain text run and streamed, over Chat Completions and the Responses API."""
import asyncio
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.runtime.server.clients.conftest import CITIES

MODELS = [OpenAIChatModel, OpenAIResponsesModel]


class City(BaseModel):
    name: Literal["Paris", "Oslo"]
    population: int = Field(ge=0, le=99)


def agent(base_url: str, model: str, kind, max_tokens: int = 8, **kw) -> Agent:
    provider = OpenAIProvider(base_url=base_url, api_key="unused")
    return Agent(kind(model, provider=provider), model_settings={"max_tokens": max_tokens, "temperature": 0}, **kw)


@pytest.mark.parametrize("kind", MODELS)
def test_a_structured_output_type_comes_back_validated(base_url, model, kind):
    result = agent(base_url, model, kind, max_tokens=100, output_type=City).run_sync("The capital of France?")
    assert isinstance(result.output, City) and result.output.name in CITIES
    assert result.usage.requests == 1 and result.usage.output_tokens > 0


@pytest.mark.parametrize("kind", MODELS)
def test_text_run_and_streamed_agree(base_url, model, kind):
    text_agent = agent(base_url, model, kind)
    whole = text_agent.run_sync("hello").output

    async def streamed() -> list[str]:
        async with text_agent.run_stream("hello") as run:
            return [piece async for piece in run.stream_text(delta=True, debounce_by=None)]

    pieces = asyncio.run(streamed())
    assert len(pieces) > 1 and "".join(pieces) == whole and whole
