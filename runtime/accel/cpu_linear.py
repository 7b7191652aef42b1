"""fp32 linear layers on the CPU through oneDNN, with each weight reordered (packed) once at load.

F.linear hands the weight to MKL's sgemm, which repacks it on every call. At decode batch sizes that
repacking is a large part of the product: oneDNN with a weight packed once is about 2x faster at 8
rows, 5-30% at 64 rows and 1.5x for the LM head at 64 rows (profiling/benchmarks/bench_cpu_ops.py). From a few
hundred rows on (prefill chunks) plain F.linear is as fast or faster, so the layer keeps both and
picks by row count; the packed copies cost one more copy of the linear weights in host memory.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from runtime.model.linear import DenseLinear, tensor_bytes

PACKED_MAX_ROWS = 256  # at and above this many rows F.linear is as fast (measured on AVX2 and AVX-512)


def _ops_available() -> bool:
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The oneDNN-packed copy of an fp32 CPU weight [out, in], or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2 or not _ops_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
        ok = torch.allclose(packed_linear(probe, packed, None), F.linear(probe, weight), rtol=1e-4, atol=1e-4)
    except RuntimeError:
        return None
    return packed if ok else None


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedCpuLinear(DenseLinear):
    """F.linear, through the packed weight when x has few rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor) -> None:
        super().__init__(weight, bias)
        self.packed = packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] < PACKED_MAX_ROWS:
            return packed_linear(x, self.packed, self.bias)
        return super().__call__(x)

    def weight_bytes(self) -> int:
        return super().weight_bytes() + tensor_bytes(self.packed)
