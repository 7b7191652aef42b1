"""The `cute` backend: CuTe DSL kernels on Hopper (sm_90), same contracts as the torch reference.

Prefill runs the sm_90a kernel, JIT-compiled when nvidia-cutlass-dsl is installed, else the
ahead-of-time library built by `python -m cute_kernels.aot` (build/aot or $CUTE_AOT_DIR;
$CUTE_KERNELS_PATH forces one); decode and the elementwise ops are still the references. prefill
raises CuteBackendUnavailable, saying why, anywhere else (CPU tensors, a non-Hopper GPU, neither the
DSL nor usable AOT kernels); select_backend picks the torch backend in that case.
"""
from __future__ import annotations

import torch

from cute_kernels.attention_args import PrefillArgs
from runtime.model.attention_batch import AttentionBatch
from runtime.model.torch_backend import TorchBackend


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

    def describe(self) -> str:
        return "CuTe kernels (sm_90a)"

    def plan(self, batch: AttentionBatch) -> None:
        """The prefill kernel's int32 tables, their block ids checked against the cache once per step
        (a bad table is a ValueError here, not an illegal address in every layer's kernel)."""
        if batch.cu_seqlens_q is not None and batch.prefill_plan is None:
            from cute_kernels.hopper.prefill_host import plan_prefill

            batch.prefill_plan = plan_prefill(batch.prefix_lens, batch.prefill_block_tables, batch.num_blocks)
        super().plan(batch)

    def prefill(self, args: PrefillArgs) -> torch.Tensor:
        """The sm_90a kernel; args.max_seqlen_q (from the runner) spares it a device sync per layer."""
        device = args.q.device
        if device not in self._ready_devices:
            reason = unavailable_reason(device)
            if reason is not None:
                raise CuteBackendUnavailable(f"cute prefill attention unavailable: {reason}")
            self._ready_devices.add(device)
        from cute_kernels.hopper.prefill_launch import prefill_attention

        return prefill_attention(args)
