"""The torch backend: the references of cute_kernels/reference.py, which run on any device and dtype
and are the oracle the other backends are tested against. A step that a CUDA graph captures carries a
StaticDecodePlan and decodes with the sync-free reference of cute_kernels/reference_static.py."""
from __future__ import annotations

from typing import Any

import torch

from cute_kernels import reference
from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.kv_quant import KVScales
from cute_kernels.reference_static import StaticDecodePlan, decode_attention_static_ref
from runtime.model.attention_backend import AttentionBackend
from runtime.model.attention_batch import AttentionBatch


class TorchBackend(AttentionBackend):
    name = "torch"

    def describe(self) -> str:
        return "torch reference"

    def plan(self, batch: AttentionBatch) -> None:
        if batch.num_decode_tokens and batch.decode_plan is None:
            batch.decode_plan = reference.plan_decode(batch.decode_block_tables, batch.decode_context_lens,
                                                      batch.block_size)

    # whether a captured decode reads every sequence's block table to its full width (the static
    # reference does; a kernel reading only each context does not): CUDA graphs cap the width then
    graph_reads_full_tables = True

    def graph_decode_plan(self, batch: AttentionBatch, max_context: int) -> Any:
        """The decode plan a captured CUDA graph replays over batch's static tables (made before the
        capture; contexts up to max_context): here the sync-free reference."""
        return StaticDecodePlan()

    def prefill(self, args: PrefillArgs) -> torch.Tensor:
        return reference.prefill_attention_ref(args)

    def decode(self, args: DecodeArgs) -> torch.Tensor:
        if isinstance(args.plan, StaticDecodePlan):
            return decode_attention_static_ref(args)
        return reference.decode_attention_ref(args)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
        reference.write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return reference.add_rms_norm_ref(x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return reference.silu_and_mul_ref(gate_up)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return reference.rope_ref(x, cos, sin)
