"""Rotary position embeddings (HF rotate-half layout), with llama3 and linear frequency scaling."""
from __future__ import annotations

import math
from typing import Any

import torch

from runtime.errors import ModelLoadError


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's scheme: long wavelengths divided by `factor`, short ones kept, smooth between."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_ctx / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(mid, blended, scaled)


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    raise ModelLoadError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


class RotaryEmbedding:
    """Precomputed cos/sin tables indexed by absolute position."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.cos = angles.cos().to(device=device, dtype=dtype)  # [max_pos, d/2]
        self.sin = angles.sin().to(device=device, dtype=dtype)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows [tokens, 1, d/2] for a step's positions: gathered once, used by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
