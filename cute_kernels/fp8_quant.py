"""FP8 (e4m3) quantization in torch: what the GEMM's operands and scales are, on any device.

Scale conventions (the FP8 GEMM's two modes; dequantized value = e4m3 value x scale):
- rowwise: one fp32 scale per row, [rows, 1]: per token for activations, per output channel for
  weights.
- block128: activations [rows, ceil(K/128)] (per token per 128 of K); weights
  [ceil(N/128), ceil(K/128)] (per 128x128 block, DeepSeek-V3 / DeepGEMM).
Each scale is amax / 448 of its group, so the group's largest magnitude lands on e4m3's largest finite
value; all-zero groups take a scale of 1 (any scale reproduces zeros) instead of dividing by zero.
"""
from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
BLOCK = 128


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    amax = amax.float()
    return torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))


def _to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_rowwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, cols] -> (e4m3 [rows, cols], fp32 scales [rows, 1]): per-token activations (dynamic,
    amax -> scale -> e4m3) or per-output-channel weights."""
    scale = _scale_of(x.abs().amax(dim=-1, keepdim=True))
    return _to_e4m3(x, scale), scale


def _padded_blocks(x: torch.Tensor, block_rows: int) -> torch.Tensor:
    """x [rows, cols] zero-padded to whole blocks and viewed [row_blocks, block_rows, col_blocks, 128]."""
    rows, cols = x.shape
    pad_r, pad_c = -rows % block_rows, -cols % BLOCK
    padded = torch.nn.functional.pad(x.float(), (0, pad_c, 0, pad_r))
    return padded.view((rows + pad_r) // block_rows, block_rows, (cols + pad_c) // BLOCK, BLOCK)


def quantize_activation_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, K] -> (e4m3 [rows, K], fp32 scales [rows, ceil(K/128)])."""
    scale = _scale_of(_padded_blocks(x, 1).abs().amax(dim=(1, 3)))
    return _to_e4m3(x, expand_block_scales(scale, x.shape, block_rows=1)), scale


def quantize_weight_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], fp32 scales [ceil(N/128), ceil(K/128)])."""
    scale = _scale_of(_padded_blocks(w, BLOCK).abs().amax(dim=(1, 3)))
    return _to_e4m3(w, expand_block_scales(scale, w.shape, block_rows=BLOCK)), scale


def expand_block_scales(scale: torch.Tensor, shape: torch.Size | tuple[int, int], block_rows: int) -> torch.Tensor:
    """Per-block scales [row_blocks, col_blocks] -> one per element of `shape` (rows, cols)."""
    rows, cols = shape
    full = scale.float().repeat_interleave(block_rows, dim=0).repeat_interleave(BLOCK, dim=1)
    return full[:rows, :cols]


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """e4m3 [rows, cols] x its scales (rowwise [rows, 1], activation blocks [rows, ceil(cols/128)],
    or weight blocks [ceil(rows/128), ceil(cols/128)]) -> dtype."""
    rows, cols = q.shape
    if scale.shape == (rows, 1):
        full = scale.float()
    elif scale.shape == (rows, -(-cols // BLOCK)):
        full = expand_block_scales(scale, q.shape, block_rows=1)
    elif scale.shape == (-(-rows // BLOCK), -(-cols // BLOCK)):
        full = expand_block_scales(scale, q.shape, block_rows=BLOCK)
    else:
        raise ValueError(f"fp8 scales {tuple(scale.shape)} fit no scale mode of a [{rows}, {cols}] tensor")
    return (q.float() * full).to(dtype)
