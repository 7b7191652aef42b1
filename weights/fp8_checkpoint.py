"""Hugging Face checkpoints stored in FP8 (config.json `quantization_config` with quant_method "fp8"):
e4m3 linear weights beside fp32 scales, dequantized here to the float32 tensors every loader returns.

Two layouts: `weight_block_size: [128, 128]` with `<name>.weight_scale_inv` per 128x128 block
([ceil(out/128), ceil(in/128)]; DeepSeek-V3, Qwen3-FP8; multiplied in despite its name), or no
block size with `<name>.weight_scale`, one per tensor or per output channel. An e4m3 value times an
fp32 scale is within fp32 rounding (2^-24 relative) of the exact product, so --quantization fp8
re-quantizes these weights (the same 128x128 blocks, see ModelConfig.fp8_weight_block; fused q/k/v
and gate/up keep them where each part's rows are whole blocks, as in real models) to the
checkpoint's own e4m3 values when its scales are amax / 448.
"""
from __future__ import annotations

from typing import Any

import torch

from weights.errors import ModelLoadError

SUPPORTED_BLOCK = 128


def fp8_weight_block(quant: dict[str, Any], path: str) -> int | None:
    """The checkpoint's weight block size (128), or None for per-tensor / per-channel scales;
    ModelLoadError for any other quantization this engine cannot read."""
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
    if method != "fp8":
        raise ModelLoadError(f"quantized HF checkpoints ({method}) are not supported (fp8 is): {path}")
    block = quant.get("weight_block_size")
    if block is None:
        return None
    if list(block) != [SUPPORTED_BLOCK, SUPPORTED_BLOCK]:
        raise ModelLoadError(f"fp8 weight_block_size {block} is not supported (only [128, 128]): {path}")
    return SUPPORTED_BLOCK


def scale_names(weight_name: str) -> tuple[str, str]:
    base = weight_name[: -len("weight")]
    return base + "weight_scale_inv", base + "weight_scale"


def _full_scale(scale: torch.Tensor, shape: torch.Size, block: int | None, name: str) -> torch.Tensor:
    rows, cols = shape
    scale = scale.float()
    if block is not None:
        want = (-(-rows // block), -(-cols // block))
        if tuple(scale.shape) != want:
            raise ModelLoadError(f"{name}: block scales {tuple(scale.shape)}, expected {want}")
        return scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    if scale.numel() == 1:
        return scale.reshape(1, 1)
    if scale.numel() == rows:
        return scale.reshape(rows, 1)
    raise ModelLoadError(f"{name}: {scale.numel()} scales for a [{rows}, {cols}] weight (per tensor or per row)")


def dequantize_fp8_weights(tensors: dict[str, torch.Tensor], scales: dict[str, torch.Tensor],
                           block: int | None, path: str) -> None:
    """Every float8 tensor in `tensors` times its scale, in place as float32; the rest to float32."""
    for name, t in tensors.items():
        if t.dtype != torch.float8_e4m3fn:
            tensors[name] = t.to(torch.float32)
            continue
        scale = next((scales[s] for s in scale_names(name) if s in scales), None)
        if scale is None or t.dim() != 2:
            raise ModelLoadError(f"fp8 tensor {name} has no weight_scale_inv / weight_scale in {path}")
        tensors[name] = t.to(torch.float32) * _full_scale(scale, t.shape, block, name)
