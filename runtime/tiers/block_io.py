"""A device block's KV as bytes (every layer's K block rows, then V), and bytes back into a block.

Blocks are the first dimension of every cache tensor, so a block is one contiguous slice of each: on
the CPU a read is a copy of those slices and a write copies into them; on a GPU the copies go through
host memory (synchronously at eviction, on a side stream when loading)."""
from __future__ import annotations

import contextlib

import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class BlockIO:
    def __init__(self, kv_caches: KVCaches) -> None:
        self.tensors = [t for pair in kv_caches for t in pair]
        self.device = self.tensors[0].device
        self.slice_bytes = [t[0].numel() * t.element_size() for t in self.tensors]
        self.block_bytes = sum(self.slice_bytes)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def _slices(self, block: int) -> list[torch.Tensor]:
        return [t[block].reshape(-1).view(torch.uint8) for t in self.tensors]

    def read(self, block: int) -> bytearray:
        """The block's KV bytes (call between steps: the block must not be written meanwhile)."""
        parts = self._slices(block)
        if self.device.type != "cpu":
            parts = [torch.cat(parts).cpu()]
        out = bytearray(self.block_bytes)
        at = 0
        for part in parts:
            n = part.numel()
            out[at:at + n] = part.numpy().tobytes()
            at += n
        return out

    def write(self, block: int, payload: bytearray | memoryview) -> None:
        """Fill the block from bytes read() made (of the same layout: the caller checked the fingerprint).
        Safe beside a running step: the block belongs to no scheduled sequence while it fills."""
        if len(payload) != self.block_bytes:
            raise ValueError(f"a block is {self.block_bytes} bytes, got {len(payload)}")
        data = torch.frombuffer(payload, dtype=torch.uint8)
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                data = data.pin_memory().to(self.device, non_blocking=True)
        at = 0
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            for dst, n in zip(self._slices(block), self.slice_bytes):
                dst.copy_(data[at:at + n], non_blocking=True)
                at += n
        if self.stream is not None:
            self.stream.synchronize()

