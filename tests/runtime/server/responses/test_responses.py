"""POST /v1/responses and GET /v1/responses/{id} through the official openai client: text, function
tools, the typed event stream, previous_response_id over the bounded store, and clear 400s."""
import json

import jsonschema
import openai
import pytest

from runtime.server.responses.store import ResponseStore, StoredResponse
from tests.server_utils import TINY_MODEL, live_server, openai_client
from tests.tiny_engine import tiny_engine

ADD = {"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
    "additionalProperties": False}}
GREEDY = dict(model=TINY_MODEL, temperature=0, max_output_tokens=10)


@pytest.fixture(scope="module")
def client():
    with live_server(tiny_engine(num_blocks=256)) as srv:
        yield openai_client(srv.url)


def _chat_text(client, messages, max_tokens=10) -> str:
    return client.chat.completions.create(model=TINY_MODEL, messages=messages, temperature=0,
                                          max_tokens=max_tokens).choices[0].message.content


def test_text_with_instructions_equals_the_chat_answer_and_is_stored(client):
    r = client.responses.create(input="hello", instructions="be brief", **GREEDY)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == TINY_MODEL
    assert r.output_text == _chat_text(client, [{"role": "system", "content": "be brief"},
                                                {"role": "user", "content": "hello"}])
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 10 and r.usage.total_tokens == r.usage.input_tokens + 10
    assert client.responses.retrieve(r.id).output_text == r.output_text
    unstored = client.responses.create(input="hello", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_previous_response_id_continues_the_conversation(client):
    first = client.responses.create(input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                                    instructions="not carried over", **GREEDY)
    second = client.responses.create(input="and then?", previous_response_id=first.id, **GREEDY)
    assert second.previous_response_id == first.id
    assert second.output_text == _chat_text(client, [{"role": "user", "content": "hi"},
                                                     {"role": "assistant", "content": first.output_text},
                                                     {"role": "user", "content": "and then?"}])
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input="x", previous_response_id="resp_nope", **GREEDY)
    assert err.value.body["param"] == "previous_response_id"


def test_a_required_function_tool_is_called_streamed_as_typed_events_and_its_output_sent_back(client):
    kw = dict(model=TINY_MODEL, input="add one", tools=[ADD], tool_choice="required", parallel_tool_calls=False,
              max_output_tokens=60, temperature=0)
    r = client.responses.create(**kw)
    call = r.output[-1]
    assert r.status == "completed" and call.type == "function_call" and call.name == "add"
    assert 0 <= json.loads(call.arguments)["a"] <= 9 and call.call_id
    events = list(client.responses.create(stream=True, **kw))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call.arguments  # written as it comes
    assert events[-1].response.output[0].arguments == call.arguments
    answer = client.responses.create(model=TINY_MODEL, previous_response_id=r.id, max_output_tokens=5, tools=[ADD],
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": '{"sum": 2}'}])
    assert answer.status in ("completed", "incomplete") and answer.usage.input_tokens > r.usage.input_tokens


def test_the_stream_helper_gives_the_same_text_and_text_format_a_valid_json_schema(client):
    with client.responses.stream(input="hello", **GREEDY) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == client.responses.create(input="hello", **GREEDY).output_text
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = client.responses.create(model=TINY_MODEL, input="a number", max_output_tokens=40, temperature=0,
                                text={"format": {"type": "json_schema", "name": "num", "schema": schema,
                                                 "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.parametrize("kw, param", [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"temperature": "hot"}, "temperature"),
])
def test_what_is_not_supported_is_a_400_naming_the_field(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{"model": TINY_MODEL, "input": "x", "max_output_tokens": 2, **kw})
    assert err.value.body["param"] == param, err.value.body


def test_the_store_forgets_the_least_recently_used_beyond_its_bound():
    store = ResponseStore(max_responses=2)
    for rid in ("a", "b"):
        store.put(StoredResponse({"id": rid}, []))
    assert store.get("a") is not None  # a is now the most recent
    store.put(StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
