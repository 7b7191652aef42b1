"""--reasoning-parser: <think>...</think> split into reasoning_content and content, streamed the same
as not, tool calls read from the answer only, grammar-shaped outputs never split."""
from types import SimpleNamespace

import pytest
from tokenizers import AddedToken

from runtime.server.openai.chat import assistant_message
from runtime.server.openai.reasoning import PARSERS, ReasoningSplitter, split_reasoning
from runtime.server.openai.tool_parsers import PARSERS as TOOL_PARSERS
from runtime.server.openai.tools import ToolPlan
from tests.server_utils import TINY_MODEL, live_server, openai_client
from tests.tiny_engine import byte_tokenizer, tiny_engine

THINK, END = 258, 259  # ids of the "<think>" and "</think>" tokens added to the byte tokenizer
CASES = {  # text -> (deepseek_r1's split, qwen3's split)
    "<think>\nhmm</think>\n\nanswer": (("\nhmm", "\n\nanswer"), ("\nhmm", "\n\nanswer")),
    "hmm</think>ans": (("hmm", "ans"), (None, "hmm</think>ans")),
    "plain answer": (("plain answer", None), (None, "plain answer")),
    " <think>cut off": (("cut off", None), ("cut off", None)),
    "<thi": (("<thi", None), (None, "<thi")),
    "<think></think>x</think>": ((None, "x</think>"), (None, "x</think>")),
}


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_whole_outputs_split_as_each_parser_says_and_streams_agree_at_every_cut(parser):
    p = PARSERS[parser]
    for text, splits in CASES.items():
        want = splits[parser == "qwen3"]
        assert split_reasoning(p, text) == want, text
        for a in range(len(text) + 1):
            for b in range(a, len(text) + 1):
                s = ReasoningSplitter(p)
                parts = [s.feed(text[:a]), s.feed(text[a:b]), s.feed(text[b:], final=True)]
                got = "".join(r for r, _ in parts) or None, "".join(c for _, c in parts) or None
                assert got == want, (text, a, b)


def test_tool_calls_are_read_from_the_answer_not_the_thinking():
    gen = SimpleNamespace(reasoning=PARSERS["deepseek_r1"], tools=ToolPlan("auto", TOOL_PARSERS["hermes"]))
    thought = 'maybe <tool_call>{"name": "wrong", "arguments": {}}</tool_call>'
    text = f'{thought}</think>Sure.<tool_call>{{"name": "f", "arguments": {{"x": 1}}}}</tool_call>'
    message, reason = assistant_message(gen, text, "stop")
    assert message["reasoning_content"] == thought and message["content"] == "Sure."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["f"] and reason == "tool_calls"
    message, reason = assistant_message(gen, thought, "length")  # cut while thinking: no call made
    assert message["content"] is None and "tool_calls" not in message and reason == "length"


def thinking_tokenizer():
    tok = byte_tokenizer()
    tok.backend.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    assert tok.token_to_id("</think>") == END
    return tok


@pytest.fixture(scope="module", params=["deepseek_r1", "qwen3"])
def client(request):
    with live_server(tiny_engine(tokenizer=thinking_tokenizer()), reasoning_parser=request.param) as srv:
        yield openai_client(srv.url), request.param


def both_ways(client, **kw):
    """(reasoning_content, content) of the answer, non-streamed and streamed."""
    kw = dict(model=TINY_MODEL, messages=[{"role": "user", "content": "think"}], max_tokens=4, temperature=0, **kw)
    m = client.chat.completions.create(**kw).choices[0].message
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    streamed = ("".join(getattr(d, "reasoning_content", None) or "" for d in deltas) or None,
                "".join(d.content or "" for d in deltas) or None)
    return (getattr(m, "reasoning_content", None), m.content), streamed


@pytest.mark.parametrize("bias, deepseek_r1, qwen3", [
    (END, (None, "</think>" * 3), (None, "</think>" * 4)),
    (THINK, ("<think>" * 3, None), ("<think>" * 3, None))])
def test_served_answers_split_the_same_streamed_or_not(client, bias, deepseek_r1, qwen3):
    client, parser = client
    whole, streamed = both_ways(client, logit_bias={str(bias): 100})
    assert whole == streamed == (deepseek_r1 if parser == "deepseek_r1" else qwen3)
    free, free_streamed = both_ways(client, extra_body={"ignore_eos": True})
    assert free == free_streamed


def test_grammar_shaped_answers_are_never_split(client):
    client, _ = client
    whole, streamed = both_ways(client, response_format={"type": "json_object"})
    assert whole == streamed and whole[0] is None and whole[1]
