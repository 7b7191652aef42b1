"""The `cute` backend: CuTe DSL kernels on Hopper (sm_90), same contracts as the torch reference.

Prefill and paged decode attention, add+RMSNorm, RoPE, silu-and-mul and the paged KV write run sm_90a
kernels, JIT-compiled when nvidia-cutlass-dsl is installed, else the ahead-of-time library built by
`python -m cute_kernels.aot` (build/aot or $CUTE_AOT_DIR; $CUTE_KERNELS_PATH forces one). Decode is
planned once per step (cute_kernels/hopper/decode_host.py: checked tables, split count), or, for a
CUDA graph, once before capture. The fused ops take their reference
for inputs no kernel variant takes (fp32, rows that are not whole 16-byte vectors). prefill raises
CuteBackendUnavailable, saying why, anywhere else (CPU tensors, a non-Hopper GPU, neither the DSL nor
usable AOT kernels); select_backend picks the torch backend in that case.
An fp8_e4m3 cache (per-layer, per-KV-head fp32 scales in DecodeArgs / PrefillArgs and write_kv) is
written by the quantizing KV write and read by the decode and prefill kernels' e4m3 variants; nothing
falls back to a reference for it: an input no e4m3 variant takes is a ValueError.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from cute_kernels.attention_args import DecodeArgs, PrefillArgs
from cute_kernels.kv_quant import KVScales
from runtime.model.attention_batch import AttentionBatch
from runtime.model.torch_backend import TorchBackend

FUSED_DTYPES = (torch.bfloat16, torch.float16)


class CuteBackendUnavailable(RuntimeError):
    pass


def unavailable_reason(device: torch.device | None = None) -> str | None:
    """None when the cute kernels can run on `device`, else a one-line reason."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    device = torch.device("cuda") if device is None else device
    if device.type != "cuda":
        return f"tensors are on {device}, not CUDA"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"needs an sm_90 (Hopper) GPU, found sm_{major}{minor}"
    from cute_kernels.toolchain.kernel_path import kernels_unavailable_reason

    return kernels_unavailable_reason()


class CuteBackend(TorchBackend):
    name = "cute"

    def __init__(self) -> None:
        # each device is checked once: the check is not free, and prefill runs once per layer
        self._ready_devices: set[torch.device] = set()
        from cute_kernels.hopper.decode import decode_host
        from cute_kernels.hopper.fused import fused_ops

        self._decode_host, self._fused = decode_host, fused_ops

    def describe(self) -> str:
        return "CuTe kernels (sm_90a): prefill, fused norm/rope/silu/KV write (bf16, fp8_e4m3 KV); decode"

    graph_reads_full_tables = False  # the decode kernel reads each context's blocks only

    def graph_decode_plan(self, batch: AttentionBatch, max_context: int) -> Any:
        """A plan over the static tables with a split count fixed for max_context (any count is correct
        for any context), so a replay syncs nothing."""
        from cute_kernels.hopper.decode.decode_spec import num_splits

        rows, kv_heads = batch.num_decode_tokens, batch.num_kv_heads
        splits = 1 if self.batch_invariant else num_splits(rows, kv_heads, max_context)
        return self._decode_host.plan_decode(batch.decode_block_tables, batch.decode_context_lens,
                                             batch.num_blocks, kv_heads, splits=splits)

    def plan(self, batch: AttentionBatch) -> None:
        """Once per step, the kernels' plans: prefill's int32 tables and decode's split count, their block
        ids checked against the cache (a bad table is a ValueError here, not an illegal address in every
        layer's kernel)."""
        if batch.cu_seqlens_q is not None and batch.prefill_plan is None:
            from cute_kernels.hopper.prefill.prefill_host import plan_prefill

            batch.prefill_plan = plan_prefill(batch.prefix_lens, batch.prefill_block_tables, batch.num_blocks,
                                              batch.cu_seqlens_q, batch.cu_seqlens_q)  # new keys = new queries
        if batch.num_decode_tokens and batch.decode_plan is None:
            # --deterministic: one split, so each row's keys reduce in tile order in one CTA whatever the
            # batch (the split count otherwise follows batch x KV heads against the SMs)
            batch.decode_plan = self._decode_host.plan_decode(batch.decode_block_tables, batch.decode_context_lens,
                                                              batch.num_blocks, batch.num_kv_heads,
                                                              splits=1 if self.batch_invariant else None)

    def prefill(self, args: PrefillArgs) -> torch.Tensor:
        """The sm_90a kernel; args.max_seqlen_q (from the runner) spares it a device sync per layer."""
        device = args.q.device
        if device not in self._ready_devices:
            reason = unavailable_reason(device)
            if reason is not None:
                raise CuteBackendUnavailable(f"cute prefill attention unavailable: {reason}")
            self._ready_devices.add(device)
        from cute_kernels.hopper.prefill.prefill_launch import prefill_attention

        return prefill_attention(args)

    def decode(self, args: DecodeArgs) -> torch.Tensor:
        return self._decode_host.decode_attention(args)

    def _kernel_or_reference(self, kernel: Callable, reference: Callable, x: torch.Tensor, *args: Any) -> Any:
        """The kernel for 16-bit CUDA tensors it takes; the reference for the rest (e.g. fp32)."""
        if x.is_cuda and x.dtype in FUSED_DTYPES:
            try:
                return kernel(x, *args)
            except ValueError:  # a layout no variant takes: the host checks said so before any launch
                pass
        return reference(x, *args)

    def write_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, kv_scales: KVScales | None = None) -> None:
        if k_cache.dtype == torch.float8_e4m3fn:  # quantized by the kernel, or a ValueError: no fallback
            if kv_scales is None:
                raise ValueError("an fp8_e4m3 KV cache is written with its layer's scales")
            return self._fused.write_kv(k, v, k_cache, v_cache, slot_mapping, kv_scales.k, kv_scales.v)
        if kv_scales is not None:  # an int8 cache: no CuTe kernel reads one
            raise ValueError(f"the CuTe backend does not write a {k_cache.dtype} KV cache")
        self._kernel_or_reference(self._fused.write_kv, super().write_kv, k, v, k_cache, v_cache, slot_mapping)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self._kernel_or_reference(self._fused.add_rms_norm, super().add_rms_norm, x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._kernel_or_reference(self._fused.silu_and_mul, super().silu_and_mul, gate_up)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self._kernel_or_reference(self._fused.rope_, super().rope, x, cos, sin)
