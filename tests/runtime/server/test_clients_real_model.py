"""What clients do first, on the real default model behind `python -m runtime.serve`, through the
official openai client: embeddings that rank meaning, and a Responses API function call, streamed."""
import json

import numpy as np
import openai
import pytest

from tests.server_utils import serve_subprocess

pytestmark = pytest.mark.slow

SEARCH = {"type": "function", "name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"query": {"type": "string", "maxLength": 60}},
                         "required": ["query"], "additionalProperties": False}}


def test_embeddings_and_a_responses_function_call_on_the_default_model():
    with serve_subprocess("--kv-cache-memory", "256MiB", timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        assert client.models.retrieve(model).id == model
        texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell sharply today."]
        e = np.array([d.embedding for d in client.embeddings.create(model=model, input=texts).data])
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
