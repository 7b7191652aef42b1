"""The offline API's vLLM shapes: LLM.chat over one conversation or many (template controls and tools
included), and SamplingParams(guided_decoding=GuidedDecodingParams(...)) for structured output."""
import json
import re

import jsonschema
import pytest

from runtime import GuidedDecodingParams
from runtime.errors import RequestError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import CHATML, tiny_engine

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
HI = [{"role": "user", "content": "hi"}]
STORY = [{"role": "user", "content": "a story"}, {"role": "assistant", "content": "Once"}]


@pytest.fixture(scope="module")
def llm():
    return LLM.from_engine(tiny_engine())


def test_chat_takes_one_conversation_or_a_list_and_matches_generate(llm):
    tok = llm.tokenizer
    one = llm.chat(HI, GREEDY, use_tqdm=False)
    many = llm.chat([HI, STORY], GREEDY, use_tqdm=False)
    assert len(one) == 1 and len(many) == 2
    assert one[0].prompt_token_ids == tok.encode("<s>user\nhi</s>\n<s>assistant\n", False)
    assert many[0].outputs[0].token_ids == one[0].outputs[0].token_ids
    want = llm.generate([tok.encode_chat(STORY)], GREEDY, use_tqdm=False)[0]
    assert many[1].outputs[0].token_ids == want.outputs[0].token_ids


def test_chat_template_controls_and_tools(llm):
    tok = llm.tokenizer
    opened = llm.chat(STORY, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0]
    assert tok.decode(opened.prompt_token_ids).endswith("<s>assistant\nOnce")
    template = CHATML + "{{ tools | length }} tools{% if flavour %}, {{ flavour }}{% endif %}"
    out = llm.chat(HI, GREEDY, use_tqdm=False, chat_template=template, tools=[{"type": "function"}] * 2,
                   chat_template_kwargs={"flavour": "salty"})[0]
    assert tok.decode(out.prompt_token_ids).endswith("<s>assistant\n2 tools, salty")
    with pytest.raises(RequestError, match="cannot both be true"):
        llm.chat(STORY, GREEDY, continue_final_message=True)
    with pytest.raises(RequestError, match="empty"):
        llm.chat([], GREEDY)


POINT = {"type": "object", "properties": {"x": {"type": "boolean"}, "tag": {"enum": ["a", "b"]}},
         "required": ["x", "tag"], "additionalProperties": False}


@pytest.mark.parametrize("guided, check", [
    (GuidedDecodingParams(json=POINT), lambda t: jsonschema.validate(json.loads(t), POINT) is None),
    (GuidedDecodingParams(json=json.dumps(POINT)), lambda t: jsonschema.validate(json.loads(t), POINT) is None),
    (GuidedDecodingParams(json_object=True), None),
    (GuidedDecodingParams(regex="[0-9]{3}-[a-z]{2}"), lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
    (GuidedDecodingParams(choice=["yes", "no"]), lambda t: t in ("yes", "no")),
    (GuidedDecodingParams(grammar='root ::= "a" [b-c] [b-c]? "d"'), lambda t: re.fullmatch("a[bc]{1,2}d", t)),
], ids=["json", "json-text", "json_object", "regex", "choice", "grammar"])
def test_generate_with_guided_decoding_matches_the_structure(llm, guided, check):
    params = SamplingParams(temperature=0, max_tokens=40, guided_decoding=guided)
    out = llm.generate(["go"], params, use_tqdm=False)[0].outputs[0]
    if check is None:  # any object: a random model may never close it, but it opens one, and closes it validly
        assert out.text.startswith("{") and (out.finish_reason == "length" or isinstance(json.loads(out.text), dict))
        return
    assert out.finish_reason == "stop" and check(out.text), out.text


@pytest.mark.parametrize("guided, words", [(GuidedDecodingParams(), "exactly one"),
                                           (GuidedDecodingParams(regex="a", choice=["b"]), "exactly one"),
                                           (GuidedDecodingParams(json="{not json"), "not a JSON schema"),
                                           (GuidedDecodingParams(grammar="root ::= ("), "cannot compile")])
def test_a_bad_guided_decoding_raises_before_anything_runs(llm, guided, words):
    with pytest.raises(RequestError, match=words) as err:
        llm.generate(["go"], SamplingParams(max_tokens=4, guided_decoding=guided), use_tqdm=False)
    assert err.value.param == "guided_decoding"
    assert not llm.engine.has_unfinished_requests()
