"""FP8 (e4m3) linear layer: weights stored as e4m3 with fp32 scales (one byte per weight, half of
bf16), activations quantized per token on the fly (W8A8, dynamic).

On an sm_90 GPU it runs the CuTe FP8 GEMM (cute_kernels/hopper/fp8_gemm_*): the activation rows are
quantized by the per-token kernel (rowwise weights) or in torch (128x128 block weights), then one
GEMM applies both scales in fp32 and writes bf16. Everywhere else (the CPU, other GPUs, shapes the
kernel does not take) the same e4m3 values run through a dequantizing path: the activations are
quantized and dequantized per token exactly as the GPU path quantizes them, the weight is
dequantized per call, and F.linear runs in the compute dtype, so quality measured on the CPU is the
quality of the GPU path up to accumulation order.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from cute_kernels.fp8_quant import (
    BLOCK,
    dequantize,
    quantize_activation_blocks,
    quantize_rowwise,
    quantize_weight_blocks,
)
from runtime.model.linear import tensor_bytes

_GEMM_ALIGN = 16  # the kernel's TMA rows: N and K multiples of 16


@functools.lru_cache(maxsize=None)
def _cute_gemm_here(device: torch.device) -> bool:
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_kernels_unavailable_reason

    return fp8_kernels_unavailable_reason() is None


class Fp8Linear:
    """x @ dequantize(weight).T + bias, weight [out, in] e4m3 with rowwise [out, 1] or 128x128 block
    [ceil(out/128), ceil(in/128)] fp32 scales."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
            raise ValueError(f"Fp8Linear: weight is {weight.dtype} {tuple(weight.shape)}; expected 2-D float8_e4m3fn")
        (n, k), blocks = weight.shape, (-(-weight.shape[0] // BLOCK), -(-weight.shape[1] // BLOCK))
        if tuple(scale.shape) not in ((n, 1), blocks):
            raise ValueError(f"Fp8Linear: scales {tuple(scale.shape)} fit no scale mode of a [{n}, {k}] weight "
                             f"(rowwise [{n}, 1] or 128x128 blocks [{blocks[0]}, {blocks[1]}])")
        self.weight, self.scale, self.bias = weight, scale.float().contiguous(), bias
        self.block_scaled = tuple(scale.shape) != (n, 1)
        self.k_splits: int | None = None  # the CuTe GEMM's K splits (None: by shape; 1 under --deterministic)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, block: bool = False) -> "Fp8Linear":
        """From a float weight: per-output-channel scales, or 128x128 block scales with block=True."""
        q, scale = quantize_weight_blocks(weight) if block else quantize_rowwise(weight)
        return cls(q, scale, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self._kernel_takes(rows):
            out = self._cute(rows)
        else:
            out = self._dequantized(rows)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def _kernel_takes(self, rows: torch.Tensor) -> bool:
        n, k = self.weight.shape
        return (rows.dtype == torch.bfloat16 and n % _GEMM_ALIGN == 0 and k % _GEMM_ALIGN == 0
                and rows.shape[0] > 0 and _cute_gemm_here(rows.device))

    def _quantize_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_activation_blocks(rows) if self.block_scaled else quantize_rowwise(rows)

    def _dequantized(self, rows: torch.Tensor) -> torch.Tensor:
        q, scale = self._quantize_rows(rows)
        x = dequantize(q, scale, rows.dtype)
        return F.linear(x, dequantize(self.weight, self.scale, rows.dtype), self.bias)

    def _cute(self, rows: torch.Tensor) -> torch.Tensor:
        from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_gemm, quantize_rows

        rows = rows.contiguous()
        q, scale = quantize_activation_blocks(rows) if self.block_scaled else quantize_rows(rows)
        out = fp8_gemm(q, self.weight, scale, self.scale, splits=self.k_splits)
        return out if self.bias is None else out + self.bias

    def weight_bytes(self) -> int:
        return tensor_bytes(self.weight, self.scale, self.bias)
