"""The backend seam: attention and the fused elementwise ops the model calls, chosen once at start.

`torch` runs the references (cute_kernels/reference.py) anywhere,
except that fp32 on the CPU takes the C kernels (cute_kernels/cpu/prefill_attention.py,
decode_attention.py, fused_ops.py) when they build; `cute` swaps in the Hopper kernels for
the same contracts on an sm_90 GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.cpu import decode_attention as cpu_decode
from cute_kernels.cpu import fused_ops as fused
from cute_kernels.cpu import prefill_attention as cpu_prefill
from cute_kernels.reference import (
    add_rms_norm_ref,
    decode_attention_ref,
    plan_decode,
    prefill_attention_ref,
    rope_ref,
    silu_and_mul_ref,
    write_kv,
)
from runtime.errors import UserError
from runtime.model.attention_batch import AttentionBatch


@dataclass
class Ops:
    prefill_attention: Callable[..., torch.Tensor]
    # decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, plan), where
    # plan = plan_decode(block_tables, context_lens, k_cache) is made once per step for every layer
    decode_attention: Callable[..., torch.Tensor]
    plan_decode: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]
    # when set: plan = plan_prefill(cu_seqlens_q, cu_seqlens_k, prefix_lens, block_tables, k_cache),
    # made once per step, and prefill_attention(..., tables=plan)
    plan_prefill: Callable[..., Any] | None = None
    write_kv: Callable[..., None] = write_kv
    # (x, residual | None, weight, eps) -> (rms_norm(x + residual) * weight, x + residual)
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]] = add_rms_norm_ref
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul_ref
    rope: Callable[..., torch.Tensor] = rope_ref  # may rotate x in place: use what it returns
    label: str = ""  # what runs, for logs and the UI

    def describe(self) -> str:
        return self.label

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, batch: AttentionBatch, scale: float) -> torch.Tensor:
        """Write the step's new k/v into the paged cache, then attend decodes and prefill chunks."""
        self.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        nd = batch.num_decode_tokens
        if nd == q.shape[0]:
            return self._decode(q, k_cache, v_cache, batch, scale)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, batch, scale)
        out[nd:] = self._prefill(q[nd:], k[nd:], v[nd:], k_cache, v_cache, batch, scale)
        return out

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, batch: AttentionBatch, scale: float) -> torch.Tensor:
        prefix = batch.prefill_prefix_lens if batch.max_prefix_len else None
        cu, tables = batch.cu_seqlens_q, batch.prefill_block_tables
        args = PrefillArgs(q, k, v, cu, cu, scale, True, k_cache, v_cache, tables, prefix)
        if self.plan_prefill is not None and batch.prefill_plan is None:  # the same for every layer of the step
            batch.prefill_plan = self.plan_prefill(cu, cu, prefix, tables, tuple(k_cache.shape[:2]))
        args.plan = batch.prefill_plan
        return self.prefill_attention(args)

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                scale: float) -> torch.Tensor:
        if batch.decode_plan is None:  # the same for every layer of the step
            batch.decode_plan = self.plan_decode(batch.decode_block_tables, batch.decode_context_lens, k_cache)
        return self.decode_attention(DecodeArgs(q, k_cache, v_cache, batch.decode_block_tables,
                                                batch.decode_context_lens, scale, batch.decode_plan))


def _prefill_cpu_or_ref(args: PrefillArgs) -> torch.Tensor:
    """The C prefill kernel where it takes the shapes (head_dim a multiple of 16), else the reference."""
    if cpu_prefill.supports(args.q, args.k):
        return cpu_prefill.prefill_attention_cpu(args)
    return prefill_attention_ref(args)


def _plan_decode_ref(block_tables: torch.Tensor, context_lens: torch.Tensor, k_cache: torch.Tensor) -> Any:
    return plan_decode(block_tables, context_lens, k_cache.shape[1])


def _plan_decode_cpu(block_tables: torch.Tensor, context_lens: torch.Tensor, k_cache: torch.Tensor) -> Any:
    return cpu_decode.prepare_tables(block_tables, context_lens, k_cache.shape[0], k_cache.shape[1])


def torch_ops(device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32,
              cpu_kernels: bool = True) -> Ops:
    """The references; for fp32 on the CPU (and cpu_kernels) the C kernels, where they build."""
    ops = Ops(prefill_attention_ref, decode_attention_ref, _plan_decode_ref, label="torch reference")
    if not (cpu_kernels and device.type == "cpu" and dtype == torch.float32):
        return ops
    built = []
    if cpu_prefill.unavailable_reason() is None:
        ops.prefill_attention, ops.plan_prefill = _prefill_cpu_or_ref, cpu_prefill.prepare_tables
        built.append("prefill")
    if cpu_decode.unavailable_reason() is None:
        ops.decode_attention, ops.plan_decode = cpu_decode.decode_attention_cpu, _plan_decode_cpu
        built.append("paged decode")
    if built:
        ops.label += f" + C {' and '.join(built)} attention"
    if fused.unavailable_reason() is None:  # each falls back to its reference for inputs it does not take
        ops.add_rms_norm, ops.silu_and_mul, ops.rope = fused.add_rms_norm, fused.silu_and_mul, fused.rope_
        ops.label += " + C fused norm/rope/silu"
    if ops.label != "torch reference":
        ops.label += " (CPU)"
    return ops


def select_ops(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> Ops:
    """'torch', 'cute', or 'auto' (cute when its kernels can run on this device, torch otherwise)."""
    if name == "torch":
        return torch_ops(device, dtype)
    if name not in ("cute", "auto"):
        raise UserError(f"unknown backend {name!r} (choose torch, cute or auto)")
    reason = "not a CUDA device" if device.type != "cuda" else None
    if reason is None:
        from runtime.model import cute_backend

        reason = cute_backend.unavailable_reason(device)
    if reason is not None:
        if name == "cute":
            raise UserError(f"the cute backend cannot run here: {reason}")
        return torch_ops(device, dtype)
    return Ops(cute_backend.prefill_attention, decode_attention_ref, _plan_decode_ref, label="CuTe kernels (sm_90a)")
