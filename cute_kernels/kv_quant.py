"""The quantized KV cache's contract, shared by every backend (torch reference, C CPU kernels, CuTe):
an int8 or float8 e4m3 cache keeps the float cache's layout and shape; stored = round(x / scale)
(nearest even) saturated to the type's range, x = stored * scale, with static fp32 scales per
(layer, KV head), one for K and one for V."""
from __future__ import annotations

from dataclasses import dataclass

import torch

QUANTIZED_KV = {torch.int8: (-128.0, 127.0), torch.float8_e4m3fn: (-448.0, 448.0)}  # saturation bounds
QMAX = {dtype: hi for dtype, (_, hi) in QUANTIZED_KV.items()}  # amax / QMAX: a scale that just holds amax


@dataclass(frozen=True)
class KVScales:
    """One layer's scales: k and v are fp32 [num_kv_heads] on the cache's device."""

    k: torch.Tensor
    v: torch.Tensor


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QUANTIZED_KV


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """x [..., kv_heads, d] (float) -> dtype, head h divided by scale[h]; a float dtype is a plain cast."""
    if not is_quantized(dtype):
        return x.to(dtype)
    lo, hi = QUANTIZED_KV[dtype]
    q = (x.float() / scale.view(-1, 1)).clamp(lo, hi)
    return (q.round() if dtype == torch.int8 else q).to(dtype)


def dequantize(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """stored [..., kv_heads, d] -> float dtype, head h times scale[h] (a float cache: a plain cast)."""
    if not is_quantized(stored.dtype):
        return stored.to(dtype)
    return (stored.float() * scale.view(-1, 1)).to(dtype)


def round_trip(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """x as a cache of cache_dtype holds it, back in x's dtype."""
    return dequantize(quantize(x, cache_dtype, scale), scale, x.dtype)


def checked_scales(scales: KVScales | None, kv_heads: int, device: torch.device,
                   what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, v) scales as a kernel reads them: contiguous fp32 [kv_heads] on device; ValueError naming `what`."""
    for name, s in (("k_scale", None if scales is None else scales.k), ("v_scale", None if scales is None else scales.v)):
        if s is None or s.dtype != torch.float32 or s.shape != (kv_heads,) or not s.is_contiguous() \
                or s.device != device:
            got = "None" if s is None else f"{s.dtype} {tuple(s.shape)} on {s.device}"
            raise ValueError(f"{what}: an fp8_e4m3 cache needs {name} as contiguous fp32 [{kv_heads}] on {device}, "
                             f"got {got}")
    return scales.k, scales.v
