"""The KV cache starts as zeros on the CPU without writing them (fresh mapped pages), including where
the allocator hands back memory that held other values."""
from __future__ import annotations

import os

import pytest
import torch

from runtime.accel.host_allocator import tune_host_allocator
from runtime.kv.cache import allocate_kv_cache, plan_kv_cache
from tests.tiny_engine import tiny_weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [64 << 10, 96 << 20])  # tensors of 16 KiB and 24 MiB
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


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads resident memory from /proc")
def test_cpu_kv_cache_is_not_written_when_allocated():
    """Under the engine's malloc settings blocks up to 32 MiB come from the heap, and calloc clears
    those by hand: a cache of such tensors (24 MiB each here) became resident at allocation."""
    tune_host_allocator()
    cfg = tiny_weights()[0]
    ledger = plan_kv_cache(cfg, 96 << 20, 16, torch.float32)
    before = resident_bytes()
    caches = allocate_kv_cache(cfg, ledger, "cpu", torch.float32)
    assert resident_bytes() - before < ledger.num_blocks * ledger.block_size * ledger.bytes_per_token / 4
    assert not caches[0][0].any()  # reading zeros maps the one shared zero page, not fresh memory
