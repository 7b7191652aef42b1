"""NVTX ranges for nsys timelines. Callers write `if nvtx.ON: nvtx.push(name)` ... `if nvtx.ON: nvtx.pop()`:
without CUDA the hot path pays one branch, no call (CUDA is checked once, at import)."""
from __future__ import annotations

import torch

ON = torch.cuda.is_available()


def push(name: str) -> None:
    torch.cuda.nvtx.range_push(name)


def pop() -> None:
    torch.cuda.nvtx.range_pop()


def swap(name: str) -> None:
    """End the current range and start the next (one branch for both)."""
    pop()
    push(name)
