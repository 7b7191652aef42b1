"""The token-embedding seam: ids -> rows of the table, and the table's resident bytes. DenseEmbedding
holds a float table; block_linear.BlockQuantEmbedding keeps a GGUF's quantized one."""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from runtime.model.linear import tensor_bytes


class Embedding(Protocol):
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def weight_bytes(self) -> int: ...


class DenseEmbedding:
    def __init__(self, table: torch.Tensor) -> None:
        self.table = table  # [vocab, hidden]; a tied LM head multiplies by it too

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.table)

    def weight_bytes(self) -> int:
        return tensor_bytes(self.table)
