"""A linear whose weight is held in bf16 on the CPU (--dtype bfloat16, and auto where the CPU has AVX-512
BF16): the product runs in cute_kernels/cpu/bf16_gemm.py, fp32 activations in and out, fp32 accumulation.
The fused decode step reads the same weight (runtime/accel/cpu_decode_step.py)."""
from __future__ import annotations

import torch

from cute_kernels.cpu.bf16_gemm import bf16_linear
from runtime.model.linear import tensor_bytes


class Bf16Linear:
    quantization = "bf16"  # what the ledger and the start-up log show

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.float().contiguous()
        self.invariant = False  # batch_invariant.py sets it: one summation order at every row count

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = bf16_linear(x.reshape(-1, shape[-1]).float(), self.weight, self.bias, invariant=self.invariant)
        return y.reshape(*shape[:-1], y.shape[-1])

    def weight_bytes(self) -> int:
        return tensor_bytes(self.weight, self.bias)
