"""Where the engine runs: its device and dtype, and how much memory the KV cache may take."""
from __future__ import annotations

import torch

from runtime.engine_config import EngineConfig, available_host_memory
from runtime.errors import UserError
from runtime.model.factory import default_dtype


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"invalid device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return default_dtype(device)
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def kv_budget(config: EngineConfig, device: torch.device) -> int:
    """Bytes for one rank's KV cache; read once the weights are resident, so free memory no longer counts them."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    if device.type == "cuda":
        torch.cuda.empty_cache()  # load-time temporaries held by the caching allocator are free memory too
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.85)
    # tensor-parallel ranks on the CPU share the host's memory: each takes its part of the fraction
    return int(available_host_memory() * config.kv_cache_fraction / config.tensor_parallel_size)
