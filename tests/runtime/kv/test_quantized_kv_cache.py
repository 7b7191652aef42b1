"""--kv-cache-dtype int8 / fp8_e4m3 on the CPU: the ledger's capacity, where the scales come from
(calibration, a checkpoint's k_scale / v_scale, --calculate-kv-scales), the refused combinations, and
greedy decoding close to the float32 cache's. The kernels' own 8-bit tests sit beside their fp32 ones
(tests/cute_kernels/cpu/test_cpu_*attention.py, tests/runtime/accel/test_cpu_decode_step.py)."""
from __future__ import annotations

import pytest
import torch

from cute_kernels.cpu import decode_attention
from runtime.accel.kv_scales import calibration_ids
from runtime.device import resolve_kv_dtype
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import byte_tokenizer, tiny_engine
from weights.checkpoint import kv_scale_names

QUANTIZED = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}


@pytest.fixture(scope="module")
def engines():
    """A float32-cache engine and one per 8-bit dtype, over the same tiny model and KV budget."""
    return {name: tiny_engine(logit_scale=20.0, kv_cache_dtype=name)
            for name in ("float32", *QUANTIZED)}


@pytest.mark.parametrize("name", QUANTIZED)
def test_an_8bit_cache_holds_4x_the_tokens_of_float32(engines, name):
    fp32, quant = engines["float32"].ledger, engines[name].ledger
    assert quant.num_blocks == 4 * fp32.num_blocks and quant.bytes_per_token * 4 == fp32.bytes_per_token
    assert "4.0x float32's and 2.0x bfloat16's tokens per byte" in quant.describe()
    assert engines[name].model_runner.kv_caches[0][0].dtype == QUANTIZED[name]


@pytest.mark.parametrize("name", QUANTIZED)
def test_calibrated_scales_are_each_heads_amax_over_the_shipped_text(engines, name):
    """Without checkpoint scales the engine calibrates: scale = the head's amax over the shipped text / the
    type's largest value. Replaying the text, each (layer, head)'s largest stored magnitude is that value
    exactly (127, or e4m3's 0x7e = 448): the scales are neither loose nor saturating."""
    engine, dtype = engines[name], QUANTIZED[name]
    ids = calibration_ids(byte_tokenizer().encode)
    assert len(ids) == 1024  # = the tiny model's positions: the prompt below leaves one for the new token
    LLM.from_engine(engine).generate([ids[:1023]], SamplingParams(max_tokens=1), use_tqdm=False)
    top = 127 if dtype == torch.int8 else 0x7E
    for layer, caches in zip(engine.model_runner.model.layers, engine.model_runner.kv_caches):
        assert layer.kv_scales.k.shape == layer.kv_scales.v.shape == (2,)
        for cache in caches:
            stored = cache.view(torch.int8).int().abs() if dtype == torch.int8 else cache.view(torch.uint8).int() & 0x7F
            assert stored.amax(dim=(0, 1, 3)).tolist() == [top, top]


def test_a_checkpoints_scales_are_used_unless_calculate_is_set():
    from runtime.accel.kv_scales import KVScaleSource
    from runtime.build import make_runner
    from tests.tiny_engine import tiny_weights

    cfg, tensors = tiny_weights()
    for n in range(cfg.num_layers):
        k_name, v_name = kv_scale_names(n)
        tensors[k_name], tensors[v_name] = torch.tensor(0.05 * (n + 1)), torch.tensor([0.5, 0.25])
    source = KVScaleSource(list(range(3, 100)))
    runner, _ = make_runner(cfg, dict(tensors), 1 << 20, kv_dtype=torch.int8, kv_scale_source=source)
    for n, layer in enumerate(runner.model.layers):
        assert torch.equal(layer.kv_scales.k, torch.full((2,), 0.05 * (n + 1)))  # one scale for every head
        assert torch.equal(layer.kv_scales.v, torch.tensor([0.5, 0.25]))
    calibrated, _ = make_runner(cfg, dict(tensors), 1 << 20, kv_dtype=torch.int8,
                                kv_scale_source=KVScaleSource(source.calibration, calculate=True))
    assert not torch.equal(calibrated.model.layers[0].kv_scales.v, torch.tensor([0.5, 0.25]))
    with pytest.raises(UserError, match="k_scale: 3 values; expected 1 or 2"):
        make_runner(cfg, {**tensors, kv_scale_names(1)[0]: torch.tensor([0.1, 0.2, 0.3])}, 1 << 20,
                    kv_dtype=torch.int8, kv_scale_source=source)
    partial = {name: t for name, t in tensors.items() if name != kv_scale_names(1)[0]}
    with pytest.raises(UserError, match="some layers only"):
        make_runner(cfg, partial, 1 << 20, kv_dtype=torch.int8, kv_scale_source=source)
    with pytest.raises(UserError, match="needs scales"):
        make_runner(cfg, dict(tiny_weights()[1]), 1 << 20, kv_dtype=torch.int8)


@pytest.mark.parametrize("name", QUANTIZED)
def test_refused_combinations_are_one_line_errors(name, monkeypatch):
    with pytest.raises(UserError, match="tensor-parallel ranks do not shard"):
        tiny_engine(kv_cache_dtype=name, tensor_parallel_size=2)
    with pytest.raises(UserError, match=f"--kv-cache-dtype {name} differs"):  # float32 compute: no GPU kernel's
        resolve_kv_dtype(name, torch.float32, torch.device("cuda"))
    monkeypatch.setattr(decode_attention, "unavailable_reason", lambda: "no C compiler")
    with pytest.raises(UserError, match="read by the CPU C attention kernels, unavailable here: no C compiler") as e:
        tiny_engine(kv_cache_dtype=name)  # the reference would read it, far slower: refused, not a fallback
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name,moved", [("int8", 0.03), ("fp8_e4m3", 0.15)])
def test_greedy_decoding_follows_the_float32_cache_up_to_a_near_tie(engines, name, moved):
    """Measured on this sharp tiny model over these prompts: while the tokens agree, the chosen tokens'
    logprobs moved by at most 0.014 (int8) and 0.083 (e4m3: 3 mantissa bits) from the float32 cache's;
    bounds at about twice that. The runs may part only where float32's top two lie within 0.25."""
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    prompts = [list(b"hello int8"), list(b"the quick brown fox jumps over"), list(range(40, 90))]
    want, got = (LLM.from_engine(engines[n]).generate(prompts, params, use_tqdm=False) for n in ("float32", name))
    compared = 0
    for w, g in zip(want, got):
        for token, other, (chosen, top), (chosen_q, _) in zip(w.outputs[0].token_ids, g.outputs[0].token_ids,
                                                              w.outputs[0].logprobs, g.outputs[0].logprobs):
            if other != token:
                assert top[0][1] - top[1][1] < 0.25  # a near tie: after it the two runs rightly part
                break
            assert abs(chosen - chosen_q) < moved
            compared += 1
    assert compared >= 24  # the comparison is not vacuous


@pytest.mark.parametrize("name", QUANTIZED)
def test_a_prefix_cache_hit_computes_what_a_miss_does(engines, name):
    """New keys attend as the cache holds them (quantized and back), so a prompt that hits its own cached
    prefix gets the logprobs it got when it missed."""
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=1)
    prompt = list(range(3, 60))
    llm = LLM.from_engine(engines[name])
    first, second = (llm.generate([prompt], params, use_tqdm=False)[0].outputs[0] for _ in range(2))
    assert first.token_ids == second.token_ids
    for a, b in zip(first.logprobs, second.logprobs):
        assert abs(a[0] - b[0]) < 1e-4
