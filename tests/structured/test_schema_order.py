"""Schemas compile in the order the client wrote their properties (xgrammar enforces that order),
and the grammar cache keys on a canonical text that keeps it."""
from runtime.server.openai.protocol import ChatCompletionRequest
from runtime.server.openai.tools import tool_plan, tool_structure
from structured import StructuredOutput
from structured.schema_text import canonical_schema_text
from tests.tiny_engine import EOS, TINY_VOCAB, byte_tokenizer

REASONED = {"type": "object", "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}},
            "required": ["reasoning", "answer"], "additionalProperties": False}


def _accepts(spec: StructuredOutput, text: str) -> bool:
    proc = spec.compile(byte_tokenizer(), TINY_VOCAB).processor([EOS])
    return all(proc.accept(b) for b in text.encode())


def test_canonical_text_keeps_property_order_and_nothing_else():
    respelled = {"additionalProperties": False, "required": ["reasoning", "answer"],
                 "properties": {"reasoning": {"type": "string"}, "answer": {"type": "integer"}}, "type": "object"}
    assert canonical_schema_text(respelled) == canonical_schema_text(REASONED)
    swapped = {**REASONED, "properties": dict(reversed(REASONED["properties"].items()))}
    assert canonical_schema_text(swapped) != canonical_schema_text(REASONED)
    const = {"const": {"b": 1, "a": 2}}  # data is kept as written
    assert canonical_schema_text(const) == '{"const":{"b":1,"a":2}}'


def test_reasoning_then_answer_comes_out_in_that_order_from_a_dict_or_text():
    for schema in (REASONED, canonical_schema_text(REASONED)):
        spec = StructuredOutput.json_schema(schema)
        assert _accepts(spec, '{"reasoning": "two and two", "answer": 4}')
        assert not _accepts(spec, '{"answer"')


def test_a_required_tool_call_is_written_name_first():
    tool = {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[tool], tool_choice="required")
    spec = tool_structure(req, tool_plan(req, "hermes"))
    assert _accepts(spec, '[{"name": "search", "arguments": {"query": "x"}}]')
    assert not _accepts(spec, '[{"arguments"')
