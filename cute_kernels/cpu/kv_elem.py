"""The KV cache element types the CPU attention kernels read (csrc/kv_elem.h): fp32; bf16 rows widened
to fp32 on load (exact) and rounded to nearest even on store (as torch's .to(bfloat16)); int8 or
float8 e4m3 rows dequantized on load with an fp32 scale per KV head and quantized on store
(cute_kernels/kv_quant.py is the same contract in torch)."""
from __future__ import annotations

import torch

from cute_kernels.kv_quant import KVScales, is_quantized

KV_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2, torch.float8_e4m3fn: 3}  # the C code's KV_*


def kv_kind(k_cache: torch.Tensor, v_cache: torch.Tensor | None = None) -> int:
    """The C code's id of the caches' element type; ValueError for one it does not read."""
    dtypes = {k_cache.dtype} | ({v_cache.dtype} if v_cache is not None else set())
    if len(dtypes) != 1 or k_cache.dtype not in KV_KINDS:
        raise ValueError(f"KV caches of {sorted(map(str, dtypes))}: the CPU kernels read float32, bfloat16, int8 "
                         "or float8_e4m3fn")
    return KV_KINDS[k_cache.dtype]


def scale_pointers(cache: torch.Tensor, scales: KVScales | None, kv_heads: int) -> tuple[int | None, int | None]:
    """(k_scale, v_scale) addresses for the C code: None for a float cache; ValueError when an 8-bit
    cache comes without contiguous fp32 CPU scales of one per KV head."""
    if not is_quantized(cache.dtype):
        return None, None
    if scales is None:
        raise ValueError(f"a {cache.dtype} KV cache needs its k/v scales")
    for t in (scales.k, scales.v):
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or tuple(t.shape) != (kv_heads,):
            raise ValueError(f"KV scales must be contiguous float32 CPU tensors of shape ({kv_heads},), got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    return scales.k.data_ptr(), scales.v.data_ptr()
