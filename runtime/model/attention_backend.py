"""The kernel seam the model calls: attention over the paged KV cache and the fused elementwise ops of
a decoder layer, one object chosen once at start (select_backend.py). Implementations: TorchBackend
(the references, runs anywhere), CpuBackend (the C kernels, fp32 on the CPU), CuteBackend (Hopper).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.kv_quant import KVScales, round_trip
from runtime.model.attention_batch import AttentionBatch
from runtime.model.linear import Linear


class AttentionBackend(ABC):
    name: str  # a short id for logs: "torch", "cpu", "cute"

    @abstractmethod
    def describe(self) -> str:
        """What runs, in one line, for logs and the UI."""

    def attach(self, model: nn.Module) -> None:
        """Give a built model (every linear set) this backend's fused paths, e.g. a whole decode step."""
        return None  # most backends have none

    # what a captured CUDA graph's decode needs (runtime/accel/cuda_graphs.py); backends without graphs
    # keep these defaults
    graph_reads_full_tables = False  # its captured decode reads every table to its full width
    batch_invariant = False  # --deterministic: a row's attention may not depend on its batch (cute: one split)

    def graph_decode_plan(self, batch: AttentionBatch, max_context: int) -> Any:
        """A decode plan a graph can replay without syncing, made before the capture (None: none needed)."""
        return None

    @abstractmethod
    def plan(self, batch: AttentionBatch) -> None:
        """Per-step precomputation shared by every layer: fills batch.decode_plan / batch.prefill_plan
        (where still None), which the layers' DecodeArgs / PrefillArgs then carry."""

    @abstractmethod
    def prefill(self, args: PrefillArgs) -> torch.Tensor:
        """New query rows over [paged prefix ; new keys]: reference.prefill_attention_ref's contract."""

    @abstractmethod
    def decode(self, args: DecodeArgs) -> torch.Tensor:
        """One query per sequence over its paged context: reference.decode_attention_ref's contract."""

    @abstractmethod
    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
        """Scatter new k/v [tokens, kv_heads, d] into the caches at flat slots (block * bs + offset); an
        int8 / e4m3 cache quantized with kv_scales (cute_kernels/kv_quant.py)."""

    @abstractmethod
    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual) * weight, x + residual); residual None means zeros."""

    @abstractmethod
    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(first half of the last dim) * second half."""

    def gated(self, gate_up: Linear, x: torch.Tensor) -> torch.Tensor:
        """silu_and_mul(gate_up(x)); a backend whose linears can join the two in one pass overrides it."""
        return self.silu_and_mul(gate_up(x))

    @abstractmethod
    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [tokens, heads, d] rotated by cos/sin [tokens, 1, d/2]; may rotate x in place: use the result."""

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, batch: AttentionBatch, scale: float,
                  kv_scales: KVScales | None = None) -> torch.Tensor:
        """Write the step's new k/v into the paged cache, then attend decodes and prefill chunks.
        kv_scales: the layer's, for an int8 / e4m3 cache."""
        self.write_kv(k, v, k_cache, v_cache, batch.slot_mapping, kv_scales)
        nd = batch.num_decode_tokens
        if nd == q.shape[0]:
            return self.decode(batch.decode_args(q, k_cache, v_cache, scale, kv_scales))
        if k.dtype != k_cache.dtype:  # new keys as the cache holds them: a prefix hit then computes the same
            k, v = self.cached_rows(k, v, k_cache, v_cache, batch.slot_mapping, kv_scales)
        decoded = [self.decode(batch.decode_args(q[:nd], k_cache, v_cache, scale, kv_scales))] if nd else []
        out = self.prefill(batch.prefill_args(q[nd:], k[nd:], v[nd:], k_cache, v_cache, scale, kv_scales))
        return torch.cat([*decoded, out]) if nd else out  # a prefill-only step returns the kernel's output uncopied

    def cached_rows(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, kv_scales: KVScales | None) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v as write_kv stored them at slots, back in their dtype."""
        return round_trip(k, k_cache.dtype, kv_scales and kv_scales.k), round_trip(v, v_cache.dtype, kv_scales and kv_scales.v)
