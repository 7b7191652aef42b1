"""Torch reference of csrc/cpu_quant_gemm.c and csrc/cpu_kquant_gemm.c: the same int8 activation
blocks and the same dequantized weights (quant_blocks.dequantize, K-quants included), multiplied in
float32. Integer block dot products are exact in both, so the two differ only in the order float32
sums are taken."""
from __future__ import annotations

import torch

from cute_kernels.cpu.quant_blocks import QK, dequantize


def quantize_activations_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, k] -> (q int8 [rows, k], d [rows, k/32], s = d * sum(q) [rows, k/32]); d at fp16 precision."""
    b = x.float().reshape(x.shape[0], -1, QK)
    amax = b.abs().amax(dim=2)
    # a true division, as the C kernel's 127.f / amax (a scalar / tensor is reciprocal() * 127 in torch)
    inv = torch.where(amax != 0, torch.full_like(amax, 127.0).div(amax), torch.zeros_like(amax))
    q = (b * inv.unsqueeze(2)).round()
    d = (amax / 127.0).half().float()  # at fp16 precision, as ggml's block_q8_1 holds it
    return q.to(torch.int8).reshape(x.shape), d, d * q.sum(dim=2)


def quant_linear_ref(x: torch.Tensor, blocks: torch.Tensor, type_name: str,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, k] @ dequantize(blocks)^T (+ bias), x first quantized as the kernel quantizes it."""
    q, d, _ = quantize_activations_ref(x)
    xq = (q.float().reshape(x.shape[0], -1, QK) * d.unsqueeze(2)).reshape(x.shape)
    y = xq @ dequantize(blocks, type_name, x.shape[1]).T
    return y if bias is None else y + bias
