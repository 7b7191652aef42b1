"""The KV cache element types the CPU attention kernels read (csrc/kv_elem.h): fp32, or bf16 rows
widened to fp32 on load (exact) and rounded to nearest even on store (as torch's .to(bfloat16))."""
from __future__ import annotations

import torch

KV_KINDS = {torch.float32: 0, torch.bfloat16: 1}  # the C code's KV_F32 / KV_BF16


def kv_kind(k_cache: torch.Tensor, v_cache: torch.Tensor | None = None) -> int:
    """The C code's id of the caches' element type; ValueError for one it does not read."""
    dtypes = {k_cache.dtype} | ({v_cache.dtype} if v_cache is not None else set())
    if len(dtypes) != 1 or k_cache.dtype not in KV_KINDS:
        raise ValueError(f"KV caches of {sorted(map(str, dtypes))}: the CPU kernels read float32 or bfloat16")
    return KV_KINDS[k_cache.dtype]
