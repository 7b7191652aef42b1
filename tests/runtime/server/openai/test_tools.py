"""Tool calling: tools in the prompt, tool_choice enforced by the grammar, hermes/json parsing, and
OpenAI-shaped answers (message.tool_calls, streamed tool_calls deltas) through the openai client."""
import json

import httpx
import openai
import pydantic
import pytest

from runtime.server.openai.protocol import ChatCompletionRequest
from runtime.server.openai.tool_output import ToolDeltas, chat_message
from runtime.server.openai.tool_parsers import PARSERS
from runtime.server.openai.tools import ToolPlan, chat_messages, tool_plan
from tests.server_utils import TINY_MODEL, live_server, sse_payloads
from tests.tiny_engine import CHATML, tiny_engine

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the forecast", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1,
                                                                                   "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]


def test_hermes_parser_reads_calls_and_keeps_the_rest_as_content():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>{"name": "f", ' \
           '"arguments": {}}'
    content, calls = PARSERS["hermes"].parse(text)
    assert content == "Sure." and calls == [("add", '{"a": 1}'), ("f", "{}")]
    assert PARSERS["hermes"].parse("no calls") == ("no calls", [])
    assert PARSERS["json"].parse('[{"name": "add", "parameters": {"a": 2}}]') == (None, [("add", '{"a": 2}')])
    assert PARSERS["json"].parse("plain") == ("plain", [])


def test_tools_go_into_the_system_message_when_the_template_ignores_them():
    req = ChatCompletionRequest(messages=ASK + [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}], tools=TOOLS)
    messages, variables = chat_messages(req, tool_plan(req, "hermes"), CHATML)
    assert variables == {} and messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert '"get_weather"' in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n'
                                                           '</tool_call>'}
    assert messages[3] == {"role": "user", "content": "<tool_response>\n2\n</tool_response>"}
    aware = "{% if tools %}{{ tools | tojson }}{% endif %}" + CHATML
    _, variables = chat_messages(req, tool_plan(req, "hermes"), aware)
    assert [t["function"]["name"] for t in variables["tools"]] == ["get_weather", "add"]


def _stream_by_character(plan: ToolPlan, text: str):
    """(content, {index: [id, name, arguments]}, how many deltas carried arguments before final(), called)."""
    stream, content, calls, early = ToolDeltas(plan), "", {}, 0
    deltas = [d for d in (stream.delta(ch) for ch in text) if d]
    early = sum(1 for d in deltas for tc in d.get("tool_calls", []) if tc["function"]["arguments"])
    rest, called = stream.final()
    for d in deltas + rest:
        content += d.get("content") or ""
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], [None, None, ""])
            if "id" in tc:
                assert call[0] is None, "id and name come once"
                call[0], call[1] = tc["id"], tc["function"]["name"]
            call[2] += tc["function"]["arguments"]
    return content, calls, early, called


def test_auto_calls_stream_their_arguments_as_they_are_written():
    text = 'Hi <tool_call>\n{"name": "add", "arguments": {"a": 1, "s": "x}\\"y"}}\n</tool_call>\n' \
           '<tool_call>\n{"arguments": {}, "name": "late"}\n</tool_call>'  # the second written arguments first
    content, calls, early, called = _stream_by_character(ToolPlan("auto", PARSERS["hermes"]), text)
    assert called and content == "Hi " and early > 10  # one delta per character of the first call's arguments
    assert [(c[1], c[2]) for c in calls.values()] == [("add", '{"a": 1, "s": "x}\\"y"}'), ("late", "{}")]
    assert json.loads(calls[0][2]) == {"a": 1, "s": 'x}"y'}
    message, reason = chat_message(ToolPlan("auto", PARSERS["hermes"]), "Hi <tool", "length")
    assert message["content"] == "Hi <tool" and reason == "length"


def test_required_calls_stream_as_written_and_a_call_cut_off_keeps_the_whole_ones():
    plan = ToolPlan("required", PARSERS["hermes"])
    cut = '[{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Paris", "da'
    content, calls, early, called = _stream_by_character(plan, cut)
    assert called and not content and early > 5
    assert [(c[1], c[2]) for c in calls.values()] == [("add", '{"a": 1}'), ("get_weather", '{"city": "Paris", "da')]
    message, reason = chat_message(plan, cut, "length")
    assert reason == "length" and message["content"] is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [("add", '{"a": 1}')]


@pytest.fixture(scope="module")
def client():
    with live_server(tiny_engine(num_blocks=512)) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _accumulate(stream):
    """(content, {index: [id, name, arguments]}, finish_reason) of a streamed answer."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, [None, None, ""])
            if tc.id:
                assert call[0] is None and tc.function.name, "id and name come first, once"
                call[0], call[1] = tc.id, tc.function.name
            call[2] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tool_choice_yield_valid_calls_streamed_and_not(client, choice):
    # one call each: a random model may add items to a parallel list until max_tokens
    kw = dict(model=TINY_MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, temperature=0.8,
              parallel_tool_calls=False)
    for seed in range(4):
        r = client.chat.completions.create(seed=seed, **kw).choices[0]
        assert r.finish_reason == "tool_calls" and r.message.content is None
        call = r.message.tool_calls[0]
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert args["city"] in ("Paris", "Oslo") and 1 <= args["days"] <= 7
        else:
            assert choice == "required" and 0 <= args["a"] <= 9
        content, calls, finish = _accumulate(client.chat.completions.create(seed=seed, stream=True, **kw))
        assert finish == "tool_calls" and not content
        assert [(c[1], c[2]) for c in calls.values()] == [(c.function.name, c.function.arguments)
                                                          for c in r.message.tool_calls]
    pieces = [tc.function.arguments for chunk in client.chat.completions.create(seed=0, stream=True, **kw)
              if chunk.choices for tc in chunk.choices[0].delta.tool_calls or [] if tc.function.arguments]
    assert len(pieces) > 3  # the arguments arrive as they are written, not in one delta at the end


def test_a_tool_round_trip_call_result_answer(client):
    kw = dict(model=TINY_MODEL, tools=[ADD], max_tokens=12, temperature=0)  # the byte model: 1024 tokens of context
    first = client.chat.completions.create(messages=ASK, tool_choice="required", parallel_tool_calls=False,
                                           **{**kw, "max_tokens": 60}).choices[0].message
    history = ASK + [first.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": '{"forecast": "sunny"}'}]
    final = client.chat.completions.create(messages=history, **kw).choices[0]
    assert final.finish_reason in ("stop", "length", "tool_calls")
    content, _, finish = _accumulate(client.chat.completions.create(messages=history, stream=True, **kw))
    assert finish == final.finish_reason and (final.message.content or "") == content


@pytest.mark.parametrize("body, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"tool_choice": "required", "guided_regex": "a"}, "cannot be combined"),
])
def test_tool_choices_that_cannot_be_met_are_400(client, body, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=TINY_MODEL, messages=ASK, tools=TOOLS, max_tokens=4,
                                       **{k: v for k, v in body.items() if k == "tool_choice"},
                                       extra_body={k: v for k, v in body.items() if k != "tool_choice"})
    assert words in err.value.body["message"]


class AddArgs(pydantic.BaseModel):
    a: int = pydantic.Field(ge=0, le=9)


def test_the_sdk_stream_helper_parses_a_required_strict_pydantic_tool(client):
    with client.chat.completions.stream(model=TINY_MODEL, messages=ASK, tools=[openai.pydantic_function_tool(AddArgs)],
                                        tool_choice="required", parallel_tool_calls=False, max_tokens=120,
                                        temperature=0) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and "tool_calls.function.arguments.delta" in kinds
    assert isinstance(final.message.tool_calls[0].function.parsed_arguments, AddArgs)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}, "none"])
def test_a_streamed_first_chunk_has_null_content_under_tools_as_openai_sends(client, choice):
    # OpenAI: {"role": "assistant", "content": null, "tool_calls": [...]}; a plain answer starts with a string
    body = dict(model=TINY_MODEL, messages=ASK, max_tokens=8, temperature=0, stream=True)
    if choice != "none":
        body |= dict(tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    with httpx.stream("POST", str(client.base_url).rstrip("/") + "/chat/completions", json=body, timeout=60) as r:
        first = json.loads(next(sse_payloads(r.iter_lines())))["choices"][0]["delta"]
    assert first["role"] == "assistant" and "content" in first
    assert first["content"] is None if choice != "none" else isinstance(first["content"], str)
