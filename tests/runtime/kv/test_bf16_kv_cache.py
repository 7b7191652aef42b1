"""--kv-cache-dtype bf16 on the CPU (the default there: auto): the flag's checks (before any model is
loaded), the ledger, and greedy decoding close to the float32 cache's. The kernels' own bf16 tests sit beside their fp32 ones
(tests/test_cpu_*attention.py, tests/runtime/accel/test_cpu_decode_step.py)."""
from __future__ import annotations

import argparse

import pytest
import torch

from cute_kernels.cpu import decode_attention
from runtime.device import resolve_kv_dtype
from runtime.engine_config import EngineConfig, add_engine_args
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine


def test_bad_values_are_refused_before_any_model_loads(capsys):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    assert exit_.value.code != 0 and "--kv-cache-dtype" in capsys.readouterr().err
    with pytest.raises(UserError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")


@pytest.mark.parametrize("dtype,device", [(torch.bfloat16, "cpu"), (torch.float32, "cuda")])
def test_a_cache_no_kernel_reads_is_refused(dtype, device):
    other = "float32" if dtype == torch.bfloat16 else "bf16"
    with pytest.raises(UserError, match="--kv-cache-dtype"):
        resolve_kv_dtype(other, dtype, torch.device(device))
    assert resolve_kv_dtype("auto", dtype, torch.device(device)) == dtype


def test_auto_is_bf16_for_float32_compute_on_the_cpu(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_kv_dtype("auto", torch.float32, cpu) == torch.bfloat16
    assert resolve_kv_dtype("float32", torch.float32, cpu) == torch.float32
    assert tiny_engine().model_runner.kv_caches[0][0].dtype == torch.bfloat16
    monkeypatch.setattr(decode_attention, "unavailable_reason", lambda: "no C compiler")
    assert resolve_kv_dtype("auto", torch.float32, cpu) == torch.float32  # the reference reads float32 fastest


def test_tensor_parallel_ranks_hold_a_bf16_cache_and_follow_one_rank():
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [list(b"hello bf16"), list(range(40, 90))]
    one, two = tiny_engine(kv_heads=4), tiny_engine(kv_heads=4, tensor_parallel_size=2)
    assert two.model_runner.kv_caches[0][0].dtype == torch.bfloat16
    assert ([o.outputs[0].token_ids for o in LLM.from_engine(two).generate(prompts, params, use_tqdm=False)]
            == [o.outputs[0].token_ids for o in LLM.from_engine(one).generate(prompts, params, use_tqdm=False)])


def test_bf16_doubles_the_blocks_of_a_budget():
    fp32, bf16 = tiny_engine(kv_cache_dtype="float32"), tiny_engine(kv_cache_dtype="bf16")
    assert bf16.ledger.num_blocks == 2 * fp32.ledger.num_blocks == 512
    assert bf16.model_runner.kv_caches[0][0].dtype == torch.bfloat16 and "(bfloat16, 2.0x float32's tokens per byte)" in bf16.ledger.describe()
    assert fp32.model_runner.kv_caches[0][0].dtype == torch.float32 and "(float32)" in fp32.ledger.describe()


def test_greedy_decoding_follows_the_float32_cache_up_to_a_near_tie():
    """bf16 keeps 8 bits of mantissa: on this sharp tiny model the chosen tokens' logprobs moved by at most
    0.007 (measured), so tokens must agree until float32's top two are within 0.25, logprobs within 0.05."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=2)
    prompts = [list(b"hello bf16"), list(b"the quick brown fox jumps over"), list(range(40, 90))]
    runs = [LLM.from_engine(tiny_engine(logit_scale=20.0, **kw)).generate(prompts, params, use_tqdm=False)
            for kw in ({"kv_cache_dtype": "float32"}, {})]
    compared = 0
    for want, got in zip(*runs):
        for (token, other), (chosen, top), (chosen_bf16, _) in zip(
                zip(want.outputs[0].token_ids, got.outputs[0].token_ids), want.outputs[0].logprobs,
                got.outputs[0].logprobs):
            if top[0][1] - top[1][1] < 0.25:  # a near-tie: after it the two runs may rightly part
                break
            assert other == token and abs(chosen - chosen_bf16) < 0.05
            compared += 1
    assert compared >= 12  # the comparison is not vacuous
