"""Host-side checks of paged-KV index tensors, shared by the kernels that read raw memory through them."""
from __future__ import annotations

import torch

KV_BLOCK_SIZE = 16  # tokens per paged-KV block: the runtime's cache layout, as every kernel reads it


def as_int32(t: torch.Tensor) -> torch.Tensor:
    """t as the kernels read index tensors: int32, contiguous."""
    return t.to(torch.int32).contiguous()


def check_block_ids(tables: torch.Tensor, max_len: int, num_blocks: int, block_size: int, what: str) -> None:
    """Raise ValueError unless max_len tokens fit the tables' width and every block id is in a cache
    of num_blocks blocks (the cache's geometry only: one check serves every layer's cache)."""
    if max_len > tables.shape[1] * block_size or int(tables.min()) < 0 or int(tables.max()) >= num_blocks:
        raise ValueError(f"{what} or block ids out of range of the block tables / cache")
