"""openai-agents as its users start: an Agent with a function tool on the default (Responses API)
model and on Chat Completions, run and streamed; a plain text agent."""
import asyncio
from typing import Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI

from tests.runtime.server.clients.conftest import CITIES


def run_config(base_url: str, use_responses: bool | None = None) -> RunConfig:
    # a fresh client per event loop: its connection pool belongs to the loop that made it
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    return RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=use_responses),
                     tracing_disabled=True)


def weather_agent(model: str, calls: list[str]) -> Agent:
    @function_tool
    def forecast(city: Literal["Paris", "Oslo"]) -> str:
        """The forecast for a city."""
        calls.append(city)
        return "sunny"

    # a random model never stops by itself: the run ends with the tool's result
    return Agent(name="weather", instructions="Use the forecast tool.", tools=[forecast], model=model,
                 tool_use_behavior="stop_on_first_tool",
                 model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=100,
                                              temperature=0))


@pytest.mark.parametrize("use_responses", [None, False], ids=["default_responses", "chat_completions"])
def test_a_function_tool_is_called_run_and_streamed(base_url, model, use_responses):
    calls: list[str] = []
    agent = weather_agent(model, calls)

    async def both():
        result = await Runner.run(agent, "The weather in Paris?", run_config=run_config(base_url, use_responses))
        streamed = Runner.run_streamed(agent, "The weather in Paris?", run_config=run_config(base_url, use_responses))
        kinds = [e.data.type if e.type == "raw_response_event" else e.type async for e in streamed.stream_events()]
        return result, streamed, kinds

    result, streamed, kinds = asyncio.run(both())
    assert result.final_output == streamed.final_output == "sunny"
    assert len(calls) == 2 and set(calls) <= set(CITIES)
    assert [type(i).__name__ for i in result.new_items] == ["ToolCallItem", "ToolCallOutputItem"]
    if use_responses is None:  # the Responses API's typed events, the arguments streamed as written
        assert kinds[1] == "response.created" and kinds.count("response.function_call_arguments.delta") > 2
        assert "response.completed" in kinds


def test_a_text_agent_on_chat_completions(base_url, model):
    chat = OpenAIChatCompletionsModel(model, AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0))
    agent = Agent(name="chat", model=chat, model_settings=ModelSettings(max_tokens=8, temperature=0))
    result = asyncio.run(Runner.run(agent, "hello", run_config=RunConfig(tracing_disabled=True)))
    assert isinstance(result.final_output, str) and result.final_output
    assert result.context_wrapper.usage.output_tokens == 8
