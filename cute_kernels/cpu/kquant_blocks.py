"""ggml's K-quant super-block formats (Q4_K, Q5_K, Q6_K: 256 values per block, what Q4_K_M / Q5_K_M
GGUF files hold) as torch uint8 tensors [rows, row_bytes], and their dequantization: the reference
of csrc/cpu_kquant_gemm.c and the bit-exact twin of ggml's dequantize_row_q*_K.

Layouts (little-endian, from ggml-common.h):
  Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32,
      128 bytes of nibbles; value = d * sc * q - dmin * m.
  Q5_K (176 bytes): as Q4_K, then 32 bytes of high bits before the nibbles: bit i of byte l is the
      fifth bit of value l of sub-block i.
  Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales (one
      per 16 values), f16 d; value = d * sc * (q - 32).
In each 64 values of Q4_K/Q5_K, byte l holds value l in its low and value l + 32 in its high nibble.
Q6_K splits each 128 values in four 32-value runs t: low nibble of byte l (t = 0) or l + 32 (t = 1),
high nibble of the same (t = 2, 3), with bits 2t..2t+1 of qh[l] on top.

Every product here is exact in float32 (d has 11 significant bits, sc at most 7, q at most 5), so the
only rounding is Q4_K/Q5_K's subtraction of the minimum: any evaluation order gives ggml's values.
"""
from __future__ import annotations

import torch

QK_K = 256
SUB_BLOCK = 32
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
TYPE_IDS = {"Q4_K": 0, "Q5_K": 1, "Q6_K": 2}  # csrc/cpu_kquant_gemm.c's enum


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    return b[:, at:at + 2].contiguous().view(torch.float16).float()  # [n, 1]


def scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes [n, 12] -> 6-bit scales and mins [n, 8]: bytes 0-3 and 4-7 hold sub-blocks 0-3 in their
    low 6 bits; sub-blocks 4-7 take bytes 8-11's nibbles below the top 2 bits of bytes 0-3 / 4-7."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([d & 63, (md & 0x0F) | ((d >> 6) << 4)], dim=1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 6) << 4)], dim=1)
    return sc.float(), mn.float()


def _q4k_quants(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes [n, 128] -> nibbles [n, 8, 32] in value order."""
    c = qs.reshape(-1, 4, 1, 32)
    return torch.cat([c & 0x0F, c >> 4], dim=2).reshape(-1, 8, 32)


def _high_bits(qh: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """[n, ..., 32] bytes -> [n, ..., len(shifts), 32]: (qh >> shift) & mask for each shift."""
    s = torch.tensor(shifts, dtype=torch.uint8).reshape(len(shifts), 1)
    return (qh.unsqueeze(-2) >> s) & mask


def _dequantize_q45k(b: torch.Tensor, five_bits: bool) -> torch.Tensor:
    sc, mn = scales_and_mins(b[:, 4:16])
    q = _q4k_quants(b[:, 48:176] if five_bits else b[:, 16:144])
    if five_bits:
        q = q | (_high_bits(b[:, 16:48], list(range(8)), 1) << 4)
    scale, offset = _f16(b, 0) * sc, _f16(b, 2) * mn
    return q.float() * scale.unsqueeze(2) - offset.unsqueeze(2)


def _dequantize_q6k(b: torch.Tensor) -> torch.Tensor:
    ql = b[:, :128].reshape(-1, 2, 1, 64)  # [n, half, 1, (run t & 1) * 32 + l]
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2).reshape(-1, 2, 4, 32)  # [n, half, t, l]
    high = _high_bits(b[:, 128:192].reshape(-1, 2, 32), [0, 2, 4, 6], 3)  # [n, half, t, l]
    q = ((low | (high << 4)).view(torch.int8) - 32).reshape(-1, 16, 16)
    scale = _f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float()  # [n, 16]
    return q.float() * scale.unsqueeze(2)


def dequantize_superblocks(blocks: torch.Tensor, type_name: str) -> torch.Tensor:
    """uint8 [n, block bytes] -> float32 [n, 256]."""
    b = blocks.reshape(-1, BLOCK_BYTES[type_name])
    values = _dequantize_q6k(b) if type_name == "Q6_K" else _dequantize_q45k(b, type_name == "Q5_K")
    return values.reshape(-1, QK_K)


def dequantize(blocks: torch.Tensor, type_name: str, cols: int) -> torch.Tensor:
    """[rows, row_bytes] uint8 -> [rows, cols] float32."""
    return dequantize_superblocks(blocks, type_name).reshape(blocks.shape[0], cols)
