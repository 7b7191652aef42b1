"""Host-side checks of paged-KV index tensors, shared by the kernels that read raw memory through them."""
from __future__ import annotations

import torch


def as_int32(t: torch.Tensor) -> torch.Tensor:
    """t as the kernels read index tensors: int32, contiguous."""
    return t.to(torch.int32).contiguous()


def check_block_ids(tables: torch.Tensor, max_len: int, k_cache: torch.Tensor, what: str) -> None:
    """Raise ValueError unless max_len tokens fit the tables' width and every block id is in the cache."""
    if max_len > tables.shape[1] * k_cache.shape[1] or int(tables.min()) < 0 or int(tables.max()) >= k_cache.shape[0]:
        raise ValueError(f"{what} or block ids out of range of the block tables / cache")
