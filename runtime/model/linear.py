"""The linear-layer seam: one object per weight, called on activations [rows, in] -> [rows, out].

DenseLinear runs F.linear on any device and dtype; cpu_linear.PackedCpuLinear adds a oneDNN-packed
copy for fp32 CPU weights; a quantized GEMM plugs in as another class with the same two methods.
build.make_linear picks one per weight at load.
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Linear(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    def weight_bytes(self) -> int:
        """Resident bytes of everything the layer holds (weight, bias, any packed copy)."""
        ...


class DenseLinear:
    """x @ weight.T + bias with weight [out, in] as loaded."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def weight_bytes(self) -> int:
        return tensor_bytes(self.weight, self.bias)
