"""ggml's 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as torch uint8 tensors
[rows, row_bytes]: the layout a GGUF file stores and csrc/cpu_quant_gemm.c reads in place, their
dequantization (the kernel's reference; for the K-quants it hands over to kquant_blocks.py) and
quantizers for float weights (--quantization int8 / q4).

Block layouts (little-endian): Q4_0: f16 d, 16 bytes of nibbles, value = d * (q - 8); Q4_1: f16 d,
f16 m, 16 bytes of nibbles, value = d * q + m; Q8_0: f16 d, 32 int8, value = d * q. Nibbles: byte j
holds value j in its low and value j + 16 in its high half. Q5_0 and Q5_1 are Q4_0 and Q4_1 (offset
16 instead of 8) with 4 bytes qh between the scales and the nibbles: bit j of qh (a little-endian
uint32) is the fifth bit of value j. Every product d * q is exact in float32 (11 + 5 significant
bits), so any order of evaluation gives ggml's values.
"""
from __future__ import annotations

import torch

from cute_kernels.cpu import kquant_blocks, row_groups

QK = 32
FILE_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_1": 24}
FILE_TYPE_IDS = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q5_0": 3, "Q5_1": 4}  # the C kernel's enum
# ... and the 8-row grouped layouts of row_groups.py (the same bytes per block, another order)
BLOCK_BYTES = {**FILE_BLOCK_BYTES, **{g: FILE_BLOCK_BYTES[b] for g, b in row_groups.BASE.items()}}
TYPE_IDS = {**FILE_TYPE_IDS, **{g: FILE_TYPE_IDS[b] | row_groups.C_FLAG for g, b in row_groups.BASE.items()}}
ALL_BLOCK_BYTES = {**BLOCK_BYTES, **kquant_blocks.BLOCK_BYTES}  # every type the kernels read


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return blocks[..., at:at + 2].contiguous().view(torch.float16).float()  # [..., 1]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()


def _five_bits(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """qh [..., 4] and nibbles [..., 16] -> the 5-bit values [..., 32] as float."""
    bits = torch.arange(8, dtype=torch.uint8)
    high = ((qh.unsqueeze(-1) >> bits) & 1).flatten(-2)  # [..., 32]: bit j of the little-endian uint32
    return _nibbles(qs) + 16.0 * high.float()


def block_values(type_name: str) -> int:
    """Values per block: 32, or 256 for the K-quant super-blocks (kquant_blocks.py)."""
    return kquant_blocks.QK_K if type_name in kquant_blocks.BLOCK_BYTES else QK


def row_bytes(type_name: str, cols: int) -> int:
    return cols // block_values(type_name) * ALL_BLOCK_BYTES[type_name]


def dequantize(blocks: torch.Tensor, type_name: str, cols: int) -> torch.Tensor:
    """[rows, row_bytes] uint8 -> [rows, cols] float32."""
    if type_name in kquant_blocks.BLOCK_BYTES:
        return kquant_blocks.dequantize(blocks, type_name, cols)
    if type_name in row_groups.BASE:
        return dequantize(row_groups.ungroup(blocks, type_name), row_groups.BASE[type_name], cols)
    b = blocks.reshape(blocks.shape[0], cols // QK, BLOCK_BYTES[type_name])
    if type_name == "Q8_0":
        values = b[..., 2:].contiguous().view(torch.int8).float() * _f16(b, 0)
    elif type_name == "Q4_0":
        values = (_nibbles(b[..., 2:]) - 8.0) * _f16(b, 0)
    elif type_name == "Q5_0":
        values = (_five_bits(b[..., 2:6], b[..., 6:]) - 16.0) * _f16(b, 0)
    elif type_name == "Q5_1":
        values = _five_bits(b[..., 4:8], b[..., 8:]) * _f16(b, 0) + _f16(b, 2)
    else:
        values = _nibbles(b[..., 4:]) * _f16(b, 0) + _f16(b, 2)
    return values.reshape(blocks.shape[0], cols)


def dequantize_rows(blocks: torch.Tensor, type_name: str, ids: torch.Tensor, cols: int) -> torch.Tensor:
    """Rows `ids` (1-D) of a weight held in either layout, as float32 [len(ids), cols] (embedding lookups)."""
    if type_name in row_groups.BASE:
        return dequantize(row_groups.rows_of(blocks, type_name, ids), row_groups.BASE[type_name], cols)
    return dequantize(blocks[ids], type_name, cols)


def _as_blocks(scale: torch.Tensor, tail: list[torch.Tensor]) -> torch.Tensor:
    rows, nb = scale.shape[:2]
    parts = [scale.to(torch.float16).view(torch.uint8).reshape(rows, nb, 2), *tail]
    return torch.cat(parts, dim=-1).reshape(rows, -1).contiguous()


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks of weight [rows, cols] (absmax scale per 32 values, as llama.cpp quantizes Q8_0)."""
    w = weight.float().reshape(weight.shape[0], -1, QK)
    amax = w.abs().amax(dim=2, keepdim=True)
    d = (amax / 127.0).to(torch.float16).float()  # round the scale first: the kernel reads it as f16
    q = torch.where(d > 0, w / d, torch.zeros_like(w)).round().clamp(-127, 127).to(torch.int8)
    return _as_blocks(d, [q.view(torch.uint8)])


def quantize_q4_1(weight: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks (group-wise min/max, as llama.cpp quantizes Q4_1) of weight [rows, cols]."""
    w = weight.float().reshape(weight.shape[0], -1, QK)
    lo, hi = w.amin(dim=2, keepdim=True), w.amax(dim=2, keepdim=True)
    d = ((hi - lo) / 15.0).to(torch.float16).float()
    m = lo.to(torch.float16).float()
    q = torch.where(d > 0, (w - m) / d, torch.zeros_like(w)).round().clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)
    return _as_blocks(d, [m.to(torch.float16).view(torch.uint8).reshape(*m.shape[:2], 2), packed])
