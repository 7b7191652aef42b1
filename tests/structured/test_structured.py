"""Grammar-constrained decoding (structured/ over xgrammar): the engine's masks, the matcher's
advance on kept tokens, and the API's response_format / guided_* fields on a real server."""
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import torch

from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from structured import StructuredOutput
from structured.processor import GrammarProcessor, GrammarStop
from structured.tokenizer_info import tokenizer_info
from tests.server_utils import TINY_MODEL, live_server
from tests.tiny_engine import BOS, EOS, TINY_VOCAB, byte_tokenizer, tiny_engine

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -50, "maximum": 50},
                                          "tag": {"enum": ["a", "bb"]}},
         "required": ["x", "tag"], "additionalProperties": False}


def schema_params(schema, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=kw.pop("max_tokens", 120), temperature=kw.pop("temperature", 0),
                          structured=StructuredOutput.json_schema(schema), **kw)


def test_bitmask_covers_the_logits_width_and_never_allows_special_tokens():
    info = tokenizer_info(byte_tokenizer(), TINY_VOCAB)  # 258 tokens in the tokenizer, 260 logits
    assert info.vocab_size == TINY_VOCAB
    spec = StructuredOutput("regex", "[a-z]+", "guided_regex").compile(byte_tokenizer(), TINY_VOCAB)
    proc = spec.processor([EOS])
    row = torch.zeros(TINY_VOCAB)
    proc(row)
    assert (row == 0).nonzero().flatten().tolist() == list(range(ord("a"), ord("z") + 1))
    assert proc.accept(ord("q"))
    row = torch.zeros(TINY_VOCAB)
    proc(row)
    assert row[EOS] == 0 and row[BOS] == float("-inf") and row[TINY_VOCAB - 1] == float("-inf")


def test_batched_masks_touch_only_their_rows_and_equal_one_row_at_a_time():
    regex, digits = (StructuredOutput("regex", pattern, "guided_regex").compile(byte_tokenizer(), TINY_VOCAB)
                     for pattern in ("[a-z]+", "[0-9]+"))
    logits = torch.randn(3, TINY_VOCAB, generator=torch.Generator().manual_seed(0))
    want = logits.clone()
    regex.processor([EOS])(want[0])
    digits.processor([EOS])(want[2])
    procs = [regex.processor([EOS]), digits.processor([EOS])]
    for _ in range(200):  # a row whose mask is not filled within the step's grace is deferred, unmasked
        batch = logits.clone()  # (a busy machine): its state is unchanged, so the step is simply run again
        GrammarProcessor.apply_batch(batch, [0, 2], procs)
        if not any(p.deferred() for p in procs):
            break
    assert torch.equal(batch, want) and torch.equal(batch[1], logits[1])
    assert torch.isfinite(batch[2]).nonzero().flatten().tolist() == list(range(ord("0"), ord("9") + 1))


def test_a_mask_prefetched_during_the_forward_equals_one_filled_at_sampling():
    spec = StructuredOutput("regex", "[a-c]+x", "guided_regex").compile(byte_tokenizer(), TINY_VOCAB)
    eager, ahead = spec.processor([EOS]), spec.processor([EOS])
    for token in (ord("a"), ord("b")):
        want, got = torch.zeros(TINY_VOCAB), torch.zeros(TINY_VOCAB)
        eager(want)
        ahead.prefetch()
        ahead.prefetch()  # once per state: a second call neither refills nor queues another
        ahead(got)
        assert torch.equal(got, want) and eager.accept(token) and ahead.accept(token)
    ahead.prefetch()  # a mask filled for a state the next accept leaves is dropped, not applied later
    assert ahead.accept(ord("x")) and ahead._next_mask is None
    row = torch.zeros(TINY_VOCAB)
    ahead(row)
    assert torch.isfinite(row).nonzero().flatten().tolist() == [EOS]


def test_length_limited_strings_take_no_control_characters():
    schema = {"type": "object", "properties": {"f": {"type": "string", "minLength": 1, "maxLength": 3}},
              "required": ["f"]}
    spec = StructuredOutput.json_schema(schema).compile(byte_tokenizer(), TINY_VOCAB)

    def accepts(text: bytes) -> bool:
        proc = spec.processor([EOS])
        return all(proc.accept(b) for b in text)

    assert accepts('{"f": "é5"}'.encode()) and accepts(b'{"f": "abc"}')
    assert not accepts(b'{"f": "\x06') and not accepts(b'{"f": "abcd') and not accepts(b'{"f": ""')


def test_grammar_rows_and_free_rows_in_one_batch_keep_the_free_rows_greedy_tokens():
    llm = LLM.from_engine(tiny_engine())
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = ["abc", "hello", "xyz", "a longer prompt here"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts[::2], free, use_tqdm=False)]
    mixed = llm.generate(prompts, [free, schema_params(POINT), free,
                                   schema_params(POINT, temperature=0.9, seed=3, n=2)], use_tqdm=False)
    assert [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids] == alone
    for out in (mixed[1], mixed[3]):
        for c in out.outputs:
            assert c.finish_reason == "stop"
            jsonschema.validate(json.loads(c.text), POINT)


def test_stop_strings_and_speculation_leave_the_grammar_whole():
    llm = LLM.from_engine(tiny_engine(speculative="ngram"))
    out = llm.generate(["ab" * 20], schema_params(POINT, stop=["zzz"]), use_tqdm=False)[0].outputs[0]
    jsonschema.validate(json.loads(out.text), POINT)
    assert schema_params(POINT).validate(TINY_VOCAB).speculative is False  # no drafts for a grammared sequence


def test_a_grammar_that_allows_no_token_ends_the_choice_with_stop_and_says_why():
    # min_tokens bans eos where the grammar allows nothing else: the argmax of an all -inf row is
    # token 0, which the grammar refuses
    llm = LLM.from_engine(tiny_engine())
    p = SamplingParams(max_tokens=10, min_tokens=5, temperature=0,
                       structured=StructuredOutput.choice(["ab"]))
    out = llm.generate(["x"], p, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.text == "ab" and isinstance(out.stop_reason, GrammarStop)
    assert "allows no further token" in out.stop_reason


def test_a_complete_grammar_ends_the_choice_with_stop_even_with_ignore_eos():
    llm = LLM.from_engine(tiny_engine())
    p = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, structured=StructuredOutput.choice(["ab"]))
    out = llm.generate(["x"], p, use_tqdm=False)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", "the grammar is complete: nothing may follow", "ab")
    assert out.token_ids == [ord("a"), ord("b"), EOS]


def _random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["int", "num", "enum", "bool", "str", "pattern"] + (["obj", "arr"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        lo = rng.randint(-100, 100)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if kind == "num":
        return {"type": "number", "minimum": 0, "maximum": 10}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "x", "a b", "é"], rng.randint(1, 4))}
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "str":  # a random byte model writes any bytes: xgrammar passes overlong UTF-8 forms,
        # which decode to U+FFFD and break a maxLength check (test_length_limited_strings covers those)
        return {"type": "string", "pattern": f"^[a-zA-Z0-9 ]{{0,{rng.randint(0, 6)}}}$"}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[a-z]{2,4}$", r"^[0-9]{3}-[A-Z]$", r"^(yes|no)$"])}
    if kind == "arr":
        return {"type": "array", "items": _random_schema(rng, depth + 1), "minItems": 1, "maxItems": 3}
    props = {f"k{i}": _random_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _object_schema(rng: random.Random) -> dict:
    props = {f"f{i}": _random_schema(rng) for i in range(rng.randint(1, 3))}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


@pytest.fixture(scope="module")
def server():
    with live_server(tiny_engine(num_blocks=512)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_generated_json_schemas_validate(client):
    schemas = [_object_schema(random.Random(seed)) for seed in range(40)]

    def run(i_schema):
        i, schema = i_schema
        r = client.chat.completions.create(
            model=TINY_MODEL, messages=[{"role": "user", "content": f"case {i}"}], max_tokens=300,
            temperature=0.7, seed=i, response_format={"type": "json_schema",
                                                      "json_schema": {"name": f"s{i}", "schema": schema,
                                                                      "strict": True}})
        return schema, r.choices[0]

    with ThreadPoolExecutor(16) as pool:  # one batch: the rows share steps
        results = list(pool.map(run, enumerate(schemas)))
    for schema, choice in results:
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_and_guided_fields(client):
    r = client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=200, temperature=0.5, seed=1,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")
    text = lambda **body: client.completions.create(model=TINY_MODEL, prompt="hi", max_tokens=60, temperature=0,
                                                    extra_body=body).choices[0].text
    assert text(guided_choice=["yes", "no", "maybe"]) in ("yes", "no", "maybe")
    import re
    assert re.fullmatch(r"[a-c]{3}-[0-9]{2}", text(guided_regex="[a-c]{3}-[0-9]{2}"))
    assert text(guided_grammar='root ::= "x" [0-9] [0-9]?') in [f"x{i}" for i in range(100)] + \
        [f"x{i:02d}" for i in range(10)] + [f"x{i}" for i in range(10)]
    assert set(json.loads(text(guided_json=json.dumps(POINT)))) == {"x", "tag"}


def test_streamed_structured_output_matches_the_plain_answer(client):
    kw = dict(model=TINY_MODEL, messages=[{"role": "user", "content": "stream"}], max_tokens=120, temperature=0,
              response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": POINT}})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(whole), POINT)


@pytest.mark.parametrize("body, param, words", [
    ({"guided_json": {"type": "nonsense"}}, "guided_json", "Unsupported type"),
    ({"guided_regex": "a(b"}, "guided_regex", "parenthesis"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar", "not defined"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "at most one"),
])
def test_a_structure_the_engine_cannot_compile_is_a_400_that_says_why(client, server, body, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=TINY_MODEL, prompt="hi", max_tokens=5, extra_body=body)
    assert err.value.body["param"] == param and words in err.value.body["message"]
    server.wait_idle()


def test_openai_parse_returns_a_parsed_object(client):
    pydantic = pytest.importorskip("pydantic")

    class Answer(pydantic.BaseModel):
        ok: bool
        level: int = pydantic.Field(ge=0, le=9)

    r = client.beta.chat.completions.parse(model=TINY_MODEL, messages=[{"role": "user", "content": "parse"}],
                                           max_tokens=60, temperature=0, response_format=Answer)
    assert isinstance(r.choices[0].message.parsed, Answer)


def test_masks_late_for_their_step_defer_their_rows_and_change_no_token(monkeypatch):
    """A mask not ready when the forward ends makes its sequence sit the step out (its row is computed
    again next step), so the other rows are not held; greedy and seeded outputs stay as they were."""
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    params = [free, schema_params(POINT), schema_params(POINT, temperature=0.9, seed=3, max_tokens=40)]
    prompts = ["abc", "hello", "xyz"]

    def run():
        llm = LLM.from_engine(tiny_engine())
        return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]

    expected = run()
    fill, deferred = GrammarProcessor._fill, GrammarProcessor.deferred
    taken = []
    monkeypatch.setattr(GrammarProcessor, "_fill", lambda self: (time.sleep(0.01), fill(self))[1])
    monkeypatch.setattr(GrammarProcessor, "deferred", lambda self: taken.append(deferred(self)) or taken[-1])
    assert run() == expected
    assert sum(taken) > 10  # rows were deferred, many times
