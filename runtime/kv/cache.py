"""Per-layer paged K/V cache tensors and the memory ledger that sizes them."""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field

import torch

from runtime.errors import UserError
from weights.config import ModelConfig


@dataclass
class KVLedger:
    """What one token costs in KV memory, and how many fit in the budget."""

    bytes_per_token_per_layer: int
    bytes_per_token: int
    block_size: int
    num_blocks: int
    budget_bytes: int
    weight_bytes: int = 0  # the model's resident weights (packed copies included), for the ledger line
    tensor_parallel_size: int = 1  # >1: every figure is one rank's (its weight shard, its KV heads)
    quantization: str = ""  # how the linear weights are held, e.g. "Q4_1 x 120, Q8_0 x 1"
    kv_dtype: str = "float32"  # the cache's element type
    tiers: str = ""  # the budgets of the tiers below it (runtime/tiers/), e.g. "disk 8.0 GiB at /var/kv"
    stage_bytes: list[tuple[int, int]] = field(default_factory=list)  # pipeline stages' (weights, KV) bytes

    @property
    def max_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.bytes_per_token

    def capacity_vs(self, dtype: torch.dtype) -> float:
        """Tokens this cache's element type fits per byte, as a multiple of a dtype cache's (same model)."""
        return torch.empty((), dtype=dtype).element_size() / _element_size(self.kv_dtype)

    def capacity_note(self) -> str:
        """", 4.0x float32's and 2.0x bfloat16's tokens per byte" for a cache narrower than float32, else ""."""
        wider = [f"{self.capacity_vs(d):.1f}x {str(d).removeprefix('torch.')}'s" for d in (torch.float32, torch.bfloat16)
                 if self.capacity_vs(d) > 1]
        return f", {' and '.join(wider)} tokens per byte" if wider else ""

    def require_blocks(self) -> None:
        """Raise UserError when the budget holds not even one block."""
        if self.num_blocks < 1:
            raise UserError(f"the KV cache budget ({self.budget_bytes} bytes) holds no block of {self.block_size} "
                            f"tokens ({self.bytes_per_token * self.block_size} bytes needed)")

    def describe(self) -> str:
        tp = self.tensor_parallel_size
        held = f" ({self.quantization})" if self.quantization else ""
        stages = "; ".join(f"stage {s}: weights {w / 2**20:.1f} MiB + KV {kv / 2**20:.1f} MiB"
                           for s, (w, kv) in enumerate(self.stage_bytes))
        return (f"pipeline {len(self.stage_bytes)} stages, per rank of each: {stages}; rank 0: "
                if stages else "") + (f"tensor parallel {tp}, per rank: " if tp > 1 else "") + (
                f"weights {self.weight_bytes / 2**20:.1f} MiB{held}; "
                f"KV cache ({self.kv_dtype}{self.capacity_note()}): {self.bytes_per_token_per_layer} B/token/layer, "
                f"{self.bytes_per_token / 1024:.1f} KiB/token "
                f"over all layers; {self.num_blocks} blocks x {self.block_size} tokens = {self.max_tokens} tokens "
                f"in {self.total_bytes / 2**20:.1f} MiB (budget {self.budget_bytes / 2**20:.1f} MiB)"
                + (f"; below it: {self.tiers}" if self.tiers else ""))


def _element_size(name: str) -> int:
    return torch.empty((), dtype=getattr(torch, name)).element_size()


def plan_kv_cache(cfg: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype,
                  weight_bytes: int = 0, quantization: str = "") -> KVLedger:
    per_layer = 2 * cfg.num_kv_heads * cfg.head_dim * torch.tensor([], dtype=dtype).element_size()
    per_token = per_layer * cfg.num_layers
    num_blocks = max(budget_bytes, 0) // (per_token * block_size)
    return KVLedger(per_layer, per_token, block_size, int(num_blocks), int(budget_bytes), int(weight_bytes),
                    quantization=quantization, kv_dtype=str(dtype).removeprefix("torch."))


def allocate_kv_cache(cfg: ModelConfig, ledger: KVLedger, device: torch.device | str,
                      dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (K, V) pair per layer, each [num_blocks, block_size, kv_heads, head_dim], all zeros."""
    shape = (ledger.num_blocks, ledger.block_size, cfg.num_kv_heads, cfg.head_dim)
    zeros = _zeros_on_touch if torch.device(device).type == "cpu" else torch.zeros
    return [(zeros(shape, device=device, dtype=dtype), zeros(shape, device=device, dtype=dtype))
            for _ in range(cfg.num_layers)]


def _zeros_on_touch(shape: tuple[int, ...], device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """Zeros from an anonymous memory map: fresh pages the OS zeroes when first touched, so start-up
    does not write gigabytes (torch.zeros writes every page: seconds for the default 2 GiB cache on
    2 cores) and resident memory grows with use. Not calloc: under the engine's malloc settings
    (runtime/accel/host_allocator.py) blocks up to 32 MiB come from the heap, which calloc clears by hand,
    and the per-layer K or V of the default cache drops below that when free memory does (the
    budget follows it): the whole cache was then written at start-up, 8 s on a busy machine.
    Zeros still matter: a reference kernel multiplies masked-out rows by 0.
    No transparent huge pages: a 32-row decode step gained ~3% on them, but each first touch zeroed 2 MiB and
    prefill steps of new sequences lost ~10% (4 x 256 tokens: 276 -> 290-320 ms)."""
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if size == 0:
        return torch.zeros(shape, device=device, dtype=dtype)
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)  # the tensor keeps the map
