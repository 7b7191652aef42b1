"""A weight kept in a ggml block format (as the GGUF file stores it) instead of float32.

The blocks are a uint8 tensor [rows, row_bytes] over the file's memory map where no copy is needed;
row permutations and concatenations (q/k/v, gate/up) copy quantized bytes, never floats. Parts of
different block types (a Q4_K_M file's Q4_K q/k beside a Q6_K v) stay apart in QuantizedParts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from weights.gguf_quants import dequantize_gguf

# the block types the CPU kernels read
KEPT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def block_shape(type_name: str) -> tuple[int, int]:
    """(values, bytes) of one block: 32 values, or 256 for the K-quants' super-blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # lazily: only GGUF weights need gguf

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]


@dataclass(frozen=True)
class QuantizedTensor:
    type_name: str  # one of KEPT_TYPES
    blocks: torch.Tensor  # uint8 [rows, cols / block values * block bytes]
    cols: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.blocks.shape[0], self.cols))

    def nbytes(self) -> int:
        return self.blocks.numel()

    def dequantize(self) -> torch.Tensor:
        return dequantize_gguf(self.blocks.numpy(), self.type_name).reshape(self.shape)

    def with_blocks(self, blocks: torch.Tensor) -> "QuantizedTensor":
        return QuantizedTensor(self.type_name, blocks, self.cols)


@dataclass(frozen=True)
class QuantizedParts:
    """Row-stacked quantized weights of more than one block type, each part kept as stored."""
    parts: tuple[QuantizedTensor, ...]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((sum(p.shape[0] for p in self.parts), self.parts[0].cols))

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


Quantized = QuantizedTensor | QuantizedParts


def cat_rows(parts: list[torch.Tensor | QuantizedTensor]) -> torch.Tensor | Quantized:
    """Rows of all parts stacked: one QuantizedTensor when they share a block type, QuantizedParts when
    all are quantized in different types, else float32."""
    if not all(isinstance(p, QuantizedTensor) for p in parts):
        return torch.cat([as_float(p) for p in parts])
    merged = [parts[0]]  # neighbours of one type share blocks
    for p in parts[1:]:
        if p.type_name == merged[-1].type_name:
            merged[-1] = merged[-1].with_blocks(torch.cat([merged[-1].blocks, p.blocks]))
        else:
            merged.append(p)
    return merged[0] if len(merged) == 1 else QuantizedParts(tuple(merged))


def as_float(t: torch.Tensor | Quantized) -> torch.Tensor:
    return t.dequantize() if isinstance(t, (QuantizedTensor, QuantizedParts)) else t
