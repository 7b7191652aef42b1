"""langchain-openai as its users start: ChatOpenAI invoke and stream, bind_tools(tool_choice="any"),
with_structured_output (json_schema and function calling), the Responses API path, OpenAIEmbeddings."""
from typing import Literal

import numpy as np
import pytest
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel, Field

from tests.runtime.server.clients.conftest import CITIES


class Forecast(BaseModel):
    """The forecast for a city."""
    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=7)


def chat(base_url: str, model: str, **kw) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_retries=0,
                      **{"max_tokens": 8, **kw})


def test_invoke_and_stream_give_the_same_answer_with_usage(base_url, model):
    llm = chat(base_url, model, stream_usage=True)
    message = llm.invoke("hello")
    assert message.response_metadata["finish_reason"] == "length"
    assert message.usage_metadata["output_tokens"] == 8 and message.usage_metadata["input_tokens"] > 0
    chunks = list(llm.stream("hello"))
    assert len(chunks) > 2 and "".join(c.content for c in chunks) == message.content
    assert sum((c.usage_metadata or {}).get("output_tokens", 0) for c in chunks) == 8


def test_bind_tools_any_calls_a_tool_streamed_and_not(base_url, model):
    llm = chat(base_url, model, max_tokens=80).bind_tools([Forecast], tool_choice="any", parallel_tool_calls=False)
    message = llm.invoke("The weather in Paris for 3 days?")
    (call,) = message.tool_calls
    assert call["name"] == "Forecast" and Forecast(**call["args"]).city in CITIES
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = list(llm.stream("The weather in Paris for 3 days?"))
    assert sum(1 for c in chunks if c.tool_call_chunks) > 2  # the arguments arrive as they are written
    joined = chunks[0]
    for c in chunks[1:]:
        joined += c
    assert [(c["name"], c["args"]) for c in joined.tool_calls] == [(call["name"], call["args"])]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_returns_the_model(base_url, model, method):
    out = chat(base_url, model, max_tokens=80).with_structured_output(Forecast, method=method).invoke("Paris?")
    assert isinstance(out, Forecast) and out.city in CITIES


def test_the_responses_api_path(base_url, model):
    message = chat(base_url, model, use_responses_api=True).invoke("hello")
    assert message.content[0]["type"] == "text" and message.usage_metadata["output_tokens"] == 8


def test_openai_embeddings_documents_and_query(base_url, model):
    emb = OpenAIEmbeddings(model=model, base_url=base_url, api_key="unused", check_embedding_ctx_length=False,
                           max_retries=0)
    docs = np.array(emb.embed_documents(["The cat sat.", "Markets fell."]))
    assert docs.shape[0] == 2 and np.allclose(np.linalg.norm(docs, axis=1), 1, atol=1e-5)
    assert np.allclose(emb.embed_query("The cat sat."), docs[0], atol=1e-5)
