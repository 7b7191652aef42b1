"""--dtype as vLLM spells it (runtime/device.py): on the CPU activations stay float32, bfloat16 holds float
weights in bf16, auto does so for a bf16 checkpoint where the CPU has AVX-512 BF16; float16 is refused."""
import pytest
import torch

from cute_kernels.cpu.bf16_gemm import native_bf16
from runtime.device import resolve_dtype, resolve_weight_dtype
from runtime.errors import UserError

CPU = torch.device("cpu")
BF16_CKPT = {"w": torch.zeros(4, 4, dtype=torch.bfloat16), "norm": torch.ones(4)}
FP32_CKPT = {"w": torch.zeros(4, 4), "norm": torch.ones(4)}


@pytest.mark.parametrize("name", ["auto", "bfloat16", "float", "float32"])
def test_cpu_compute_stays_float32(name):
    assert resolve_dtype(name, CPU) == torch.float32


@pytest.mark.parametrize("name", ["half", "float16"])
def test_float16_on_the_cpu_is_a_one_line_error(name):
    with pytest.raises(UserError, match=f"--dtype {name}: no CPU kernel runs float16"):
        resolve_dtype(name, CPU)


def test_unknown_dtype_names_the_choices():
    with pytest.raises(UserError, match="unknown dtype 'fp64'"):
        resolve_dtype("fp64", CPU)


def test_weight_dtype():
    assert resolve_weight_dtype("bfloat16", CPU, FP32_CKPT) == torch.bfloat16
    assert resolve_weight_dtype("float32", CPU, BF16_CKPT) is None
    assert resolve_weight_dtype("float", CPU, BF16_CKPT) is None
    assert resolve_weight_dtype("auto", CPU, FP32_CKPT) is None  # a float32 checkpoint stays as loaded
    assert resolve_weight_dtype("auto", CPU, BF16_CKPT) == (torch.bfloat16 if native_bf16() else None)
