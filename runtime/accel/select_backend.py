"""Choose the model's kernel backend once at start: `torch`, `cute`, or `auto`."""
from __future__ import annotations

import torch

from runtime.accel.cpu_backend import CpuBackend
from runtime.errors import UserError
from runtime.model.attention_backend import AttentionBackend
from runtime.model.torch_backend import TorchBackend


def torch_backend(device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """The references; for fp32 on the CPU the C kernels that build (CUTE_SERVE_CPU_KERNELS=0: none)."""
    if device.type == "cpu" and dtype == torch.float32:
        cpu = CpuBackend()
        if cpu.runs_any_kernel:
            return cpu
    return TorchBackend()


def select_backend(name: str, device: torch.device, dtype: torch.dtype = torch.float32) -> AttentionBackend:
    """'torch', 'cute', or 'auto' (cute when its kernels can run on this device, torch otherwise)."""
    if name == "torch":
        return torch_backend(device, dtype)
    if name not in ("cute", "auto"):
        raise UserError(f"unknown backend {name!r} (choose torch, cute or auto)")
    reason = "not a CUDA device" if device.type != "cuda" else None
    if reason is None:
        from runtime.accel import cute_backend

        reason = cute_backend.unavailable_reason(device)
    if reason is not None:
        if name == "cute":
            raise UserError(f"the cute backend cannot run here: {reason}")
        return torch_backend(device, dtype)
    return cute_backend.CuteBackend()
