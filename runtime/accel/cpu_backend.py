"""The CPU backend for fp32 (the KV cache fp32, bf16, int8 or e4m3): the C kernels of cute_kernels/cpu/ that build
here (prefill and paged decode attention, fused norm/rope/silu), the torch references for the rest and for
inputs a kernel does not take (e.g. a prefill head_dim that is not a multiple of 16)."""
from __future__ import annotations

import torch

from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.cpu import decode_attention as cpu_decode
from cute_kernels.cpu import fused_ops as fused
from cute_kernels.cpu import prefill_attention as cpu_prefill
from cute_kernels.kv_quant import KVScales
from cute_kernels.reference_static import StaticDecodePlan
from runtime.accel.cpu_decode_step import CpuDecodeStep
from runtime.model.attention_batch import AttentionBatch
from runtime.model.linear import Linear
from runtime.model.torch_backend import TorchBackend


class CpuBackend(TorchBackend):
    name = "cpu"

    def __init__(self) -> None:
        # each library builds (or not) once per process; CUTE_SERVE_CPU_KERNELS=0 turns all off
        self.c_prefill = cpu_prefill.unavailable_reason() is None
        self.c_decode = cpu_decode.unavailable_reason() is None
        self.c_fused = fused.unavailable_reason() is None

    def attach(self, model) -> None:
        if self.c_decode and CpuDecodeStep.available(model):  # decode-only steps in one C call
            model.decode_step = CpuDecodeStep(model)

    @property
    def runs_any_kernel(self) -> bool:
        return self.c_prefill or self.c_decode or self.c_fused

    def describe(self) -> str:
        label = "torch reference"
        built = [kind for kind, ok in (("prefill", self.c_prefill), ("paged decode", self.c_decode)) if ok]
        if built:
            label += f" + C {' and '.join(built)} attention"
        if self.c_fused:
            label += " + C fused norm/rope/silu"
        return label + " (CPU)" if self.runs_any_kernel else label

    def plan(self, batch: AttentionBatch) -> None:
        """The C kernels' int32 tables, checked against the cache geometry once for every layer."""
        geometry = (batch.num_blocks, batch.block_size)
        if self.c_prefill and batch.cu_seqlens_q is not None and batch.prefill_plan is None:
            cu = batch.cu_seqlens_q
            batch.prefill_plan = cpu_prefill.prepare_tables(cu, cu, batch.prefix_lens, batch.prefill_block_tables,
                                                            geometry)
        if self.c_decode and batch.num_decode_tokens and batch.decode_plan is None:
            batch.decode_plan = cpu_decode.prepare_tables(batch.decode_block_tables, batch.decode_context_lens,
                                                          *geometry)
        super().plan(batch)  # the reference's decode plan where the C decode did not build

    def prefill(self, args: PrefillArgs) -> torch.Tensor:
        if self.c_prefill and cpu_prefill.supports(args.q, args.k):
            return cpu_prefill.prefill_attention_cpu(args)
        return super().prefill(args)  # the reference ignores the C tables in args.plan

    def decode(self, args: DecodeArgs) -> torch.Tensor:
        if self.c_decode and not isinstance(args.plan, StaticDecodePlan):  # static: what a graph would run
            return cpu_decode.decode_attention_cpu(args)
        return super().decode(args)

    # each fused op falls back to its reference by itself for inputs the C code does not take
    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
        if self.c_fused:
            return fused.write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)
        return super().write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales)

    def cached_rows(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, kv_scales: KVScales | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows write_kv just stored, read back from the caches in one C pass (not a second rounding)."""
        if self.c_fused:
            return fused.read_kv(k_cache, v_cache, slots, kv_scales)
        return super().cached_rows(k, v, k_cache, v_cache, slots, kv_scales)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if self.c_fused:
            return fused.add_rms_norm(x, residual, weight, eps)
        return super().add_rms_norm(x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return fused.silu_and_mul(gate_up) if self.c_fused else super().silu_and_mul(gate_up)

    def gated(self, gate_up: Linear, x: torch.Tensor) -> torch.Tensor:
        """One pass where the linear offers it (a quantized gate/up pair on the AMX tiles: the same bits)."""
        joined = getattr(gate_up, "silu_and_mul", None) if self.c_fused else None
        out = joined(x) if joined is not None else None
        return out if out is not None else self.silu_and_mul(gate_up(x))

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return fused.rope_(x, cos, sin) if self.c_fused else super().rope(x, cos, sin)
