"""A weight kept in a ggml block format (as the GGUF file stores it) instead of float32.

The blocks are a uint8 tensor [rows, row_bytes] over the file's memory map where no copy is needed;
row permutations and concatenations (q/k/v, gate/up) copy quantized bytes, never floats.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from weights.gguf_quants import dequantize_gguf

BLOCK_VALUES = 32
BLOCK_TYPES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # bytes per block of 32 values, for the types kept


@dataclass(frozen=True)
class QuantizedTensor:
    type_name: str  # a key of BLOCK_TYPES
    blocks: torch.Tensor  # uint8 [rows, cols / 32 * block bytes]
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


def cat_rows(parts: list[torch.Tensor | QuantizedTensor]) -> torch.Tensor | QuantizedTensor:
    """Rows of all parts stacked: quantized when they all share one block type, else float32."""
    kinds = {p.type_name if isinstance(p, QuantizedTensor) else None for p in parts}
    if len(kinds) == 1 and None not in kinds:
        return parts[0].with_blocks(torch.cat([p.blocks for p in parts]))
    return torch.cat([as_float(p) for p in parts])


def as_float(t: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    return t.dequantize() if isinstance(t, QuantizedTensor) else t
