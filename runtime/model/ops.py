"""The backend seam: attention (and later linear) ops the model calls, chosen once at start.

`torch` runs the references in cute_kernels/attention_ref.py anywhere, except that fp32 attention
on the CPU takes the C kernels (cute_kernels/cpu_prefill_attention.py, cpu_decode_attention.py)
when they build; `cute` swaps in the Hopper kernels for the same contracts on an sm_90 GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from cute_kernels import cpu_decode_attention as cpu_decode
from cute_kernels import cpu_prefill_attention as cpu_prefill
from cute_kernels.attention_ref import (
    decode_attention_ref,
    plan_decode,
    prefill_attention_ref,
    write_kv,
)
from runtime.errors import UserError
from runtime.model.attention_batch import AttentionBatch


@dataclass
class Ops:
    name: str
    prefill_attention: Callable[..., torch.Tensor]
    # decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, plan), where
    # plan = plan_decode(block_tables, context_lens, k_cache) is made once per step for every layer
    decode_attention: Callable[..., torch.Tensor]
    plan_decode: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Any]
    # when set: plan = plan_prefill(cu_seqlens_q, cu_seqlens_k, prefix_lens, block_tables, k_cache),
    # made once per step, and prefill_attention(..., tables=plan)
    plan_prefill: Callable[..., Any] | None = None
    write_kv: Callable[..., None] = write_kv
    label: str = ""  # what runs, for logs and the UI

    def describe(self) -> str:
        return self.label or self.name

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
        args = (q, k, v, cu, cu, scale, True, k_cache, v_cache, tables, prefix)
        if self.plan_prefill is None:
            return self.prefill_attention(*args)
        if batch.prefill_plan is None:  # the same for every layer of the step
            batch.prefill_plan = self.plan_prefill(cu, cu, prefix, tables, k_cache)
        return self.prefill_attention(*args, tables=batch.prefill_plan)

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: AttentionBatch,
                scale: float) -> torch.Tensor:
        if batch.decode_plan is None:  # the same for every layer of the step
            batch.decode_plan = self.plan_decode(batch.decode_block_tables, batch.decode_context_lens, k_cache)
        return self.decode_attention(q, k_cache, v_cache, batch.decode_block_tables, batch.decode_context_lens,
                                     scale, batch.decode_plan)


def _prefill_cpu_or_ref(q: torch.Tensor, k: torch.Tensor, *args: Any,
                        tables: cpu_prefill.PrefillTables | None = None) -> torch.Tensor:
    """The C prefill kernel where it takes the shapes (head_dim a multiple of 16), else the reference."""
    if cpu_prefill.supports(q, k):
        return cpu_prefill.prefill_attention_cpu(q, k, *args, tables=tables)
    return prefill_attention_ref(q, k, *args)


def torch_ops(device: torch.device = torch.device("cpu"), dtype: torch.dtype = torch.float32,
              cpu_kernels: bool = True) -> Ops:
    """The references; for fp32 on the CPU (and cpu_kernels) the C attention kernels, where they build."""
    if cpu_kernels and device.type == "cpu" and dtype == torch.float32:
        prefill, decode = cpu_prefill.unavailable_reason() is None, cpu_decode.unavailable_reason() is None
        kernels = [name for name, ok in (("prefill", prefill), ("paged decode", decode)) if ok]
        if kernels:
            return Ops("torch", _prefill_cpu_or_ref if prefill else prefill_attention_ref,
                       cpu_decode.decode_attention_cpu if decode else decode_attention_ref,
                       cpu_decode.prepare_tables if decode else plan_decode,
                       plan_prefill=cpu_prefill.prepare_tables if prefill else None,
                       label=f"torch reference + C {' and '.join(kernels)} attention (CPU)")
    return Ops("torch", prefill_attention_ref, decode_attention_ref, plan_decode, label="torch reference")


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
    return Ops("cute", cute_backend.prefill_attention, decode_attention_ref, plan_decode, label="CuTe kernels (sm_90a)")
