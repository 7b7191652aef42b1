"""The KV cache starts as zeros on the CPU without writing them (calloc'd pages), including where the
allocator hands back memory that held other values."""
from __future__ import annotations

import pytest
import torch

from runtime.kv_cache import allocate_kv_cache, plan_kv_cache
from tests.tiny_engine import tiny_weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [64 << 10, 96 << 20])  # heap-sized and mmap-sized tensors
def test_cpu_kv_cache_is_zeros_even_over_reused_memory(dtype, budget):
    cfg = tiny_weights()[0]
    ledger = plan_kv_cache(cfg, budget, 16, dtype)
    for _ in range(3):  # dirty memory of the same sizes, then free it for the allocator to reuse
        junk = allocate_kv_cache(cfg, ledger, "cpu", dtype)
        for k, v in junk:
            k.fill_(float("nan"))
            v.fill_(float("nan"))
        del junk
        caches = allocate_kv_cache(cfg, ledger, "cpu", dtype)
        assert len(caches) == cfg.num_layers
        for k, v in caches:
            assert k.shape == v.shape == (ledger.num_blocks, 16, cfg.num_kv_heads, cfg.head_dim)
            assert k.dtype == v.dtype == dtype and k.is_contiguous()
            assert not k.any() and not v.any()
            k.add_(1)  # writable, and its own memory
            assert not v.any()
