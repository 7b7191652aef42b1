"""Assemble a ready-to-run model (weights, kernel backend, paged KV cache, runner) from tensors."""
from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.accel.select_backend import select_backend
from runtime.kv.cache import KVLedger, allocate_kv_cache, plan_kv_cache
from runtime.model.build import build_model
from runtime.model.runner import ModelRunner
from weights.config import ModelConfig


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on the CPU (exact parity with references), bf16 on a GPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def make_runner(cfg: ModelConfig, tensors: dict[str, torch.Tensor], kv_budget_bytes: int | Callable[[], int],
                block_size: int = 16, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                backend: str = "auto", quantization: str | None = None,
                kv_dtype: torch.dtype | None = None) -> tuple[ModelRunner, KVLedger]:
    """A callable budget is asked only once the weights are in place, so free memory it reads excludes them.
    quantization: see runtime/accel/quantization.py (None: a GGUF's quantized weights as shipped).
    kv_dtype: the KV cache's element type (None: dtype; bfloat16 under float32 compute on the CPU)."""
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    model = build_model(cfg, tensors, select_backend(backend, device, dtype), device, dtype, quantization)
    budget = kv_budget_bytes() if callable(kv_budget_bytes) else kv_budget_bytes
    kv_dtype = kv_dtype or dtype
    ledger = plan_kv_cache(cfg, budget, block_size, kv_dtype, model.weight_bytes(), model.quantization())
    caches = allocate_kv_cache(cfg, ledger, device, kv_dtype)
    return ModelRunner(model, caches, block_size, device), ledger
