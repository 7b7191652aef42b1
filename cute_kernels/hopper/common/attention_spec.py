"""What the attention kernels (prefill and decode) take: element types and head sizes; the paged KV
block size is the package's (cute_kernels/paged_tables.py)."""
from __future__ import annotations

SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = ("bfloat16", "float16")
