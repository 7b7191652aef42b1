"""The e4m3 KV cache's contract, in torch (the reference the Hopper kernels are tested against).

A float8_e4m3fn cache keeps the 16-bit cache's layout and shape; each (layer, KV head) has a static
fp32 scale for K and one for V: stored = x / scale saturated to +-448 (e4m3's largest finite value;
NaN stays NaN), and x = stored * scale when read.
"""
from __future__ import annotations

import torch

from cute_kernels.kv_quant import QMAX, dequantize, quantize

E4M3_MAX = QMAX[torch.float8_e4m3fn]  # 448: e4m3's largest finite value


def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., kv_heads, d] / scale [kv_heads] in fp32, saturated, rounded to e4m3 (nearest even)."""
    return quantize(x, torch.float8_e4m3fn, scale.float())


def dequantize_e4m3(stored: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """stored [..., kv_heads, d] * scale [kv_heads], as dtype."""
    return dequantize(stored, scale.float(), dtype)


def write_kv_e4m3_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """reference.write_kv into e4m3 caches: token i to flat slot slot_mapping[i]; -1 (and, in the kernel,
    a slot past the cache) is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat = (-1,) + tuple(k_cache.shape[2:])
    k_cache.view(flat)[slots] = quantize_e4m3(k[keep], k_scale)
    v_cache.view(flat)[slots] = quantize_e4m3(v[keep], v_scale)
