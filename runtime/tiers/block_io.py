"""A device block's KV as bytes (every layer's K block rows, then V), and bytes back into a block.

Blocks are the first dimension of every cache tensor, so a block is one contiguous slice of each: on
the CPU a snapshot is a copy of those slices and a write copies into them. On a GPU both go through
pinned host memory on a side stream: an eviction's copy is queued behind the work that wrote the block
and ahead of the work that reuses it (stream order, no host wait in the step); a load's copies run on a
loader thread beside the step. The GPU path has not yet run on a GPU."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Snapshot:
    """A block's bytes as they were when it was evicted; on a GPU, a device-to-host copy under way."""
    data: torch.Tensor  # uint8, on the host
    done: torch.cuda.Event | None = None

    def bytes(self) -> memoryview:
        """The bytes in place (no copy: the snapshot owns them, nothing else writes them)."""
        if self.done is not None:
            self.done.synchronize()  # the writer thread waits, not the step
        return memoryview(self.data.numpy()).cast("B")


class BlockIO:
    def __init__(self, kv_caches: KVCaches) -> None:
        self.tensors = [t for pair in kv_caches for t in pair]
        self.device = self.tensors[0].device
        self.slice_bytes = [t[0].numel() * t.element_size() for t in self.tensors]
        self.block_bytes = sum(self.slice_bytes)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # on the CPU, numpy views of the caches' bytes: a row assignment is a memcpy (3x torch's small copies)
        self.rows = None if self.stream else [t.view(t.shape[0], -1).view(torch.uint8).numpy() for t in self.tensors]

    @property
    def on_host(self) -> bool:
        """The caches are host memory: a load from host memory is a memcpy, no device transfer."""
        return self.rows is not None

    def _slices(self, block: int) -> list[torch.Tensor]:
        return [t[block].reshape(-1).view(torch.uint8) for t in self.tensors]

    def snapshot(self, block: int) -> Snapshot:
        """The block's KV bytes as of now, safe from the block's next writer (call between steps)."""
        if self.rows is not None:
            return Snapshot(torch.from_numpy(np.concatenate([r[block] for r in self.rows])))
        parts = self._slices(block)
        out = torch.empty(self.block_bytes, dtype=torch.uint8, pin_memory=True)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # after the step that filled the block
        with torch.cuda.stream(self.stream):
            at = 0
            for part, n in zip(parts, self.slice_bytes):
                out[at:at + n].copy_(part, non_blocking=True)
                at += n
            done = torch.cuda.Event()
            done.record()
        current.wait_event(done)  # before the step that reuses it
        return Snapshot(out, done)

    def write(self, blocks: list[int], payloads: list[bytearray | memoryview]) -> None:
        """Fill these blocks from bytes snapshot() made (of the same layout: the caller checked the
        fingerprint). Safe beside a running step: the blocks belong to no scheduled sequence while they fill."""
        if any(len(p) != self.block_bytes for p in payloads):
            raise ValueError(f"a block is {self.block_bytes} bytes, got {sorted({len(p) for p in payloads})}")
        if self.rows is not None:
            for block, payload in zip(blocks, payloads):
                src, at = np.frombuffer(payload, dtype=np.uint8), 0
                for rows, n in zip(self.rows, self.slice_bytes):
                    rows[block] = src[at:at + n]
                    at += n
            return
        data = torch.frombuffer(bytearray().join(payloads), dtype=torch.uint8).view(len(payloads), -1)
        with torch.cuda.stream(self.stream):  # one host-to-device copy, then one gather per cache tensor
            data = data.pin_memory().to(self.device, non_blocking=True)
            index, at = torch.tensor(blocks, device=self.device), 0
            for t, n in zip(self.tensors, self.slice_bytes):
                t.view(t.shape[0], -1).view(torch.uint8).index_copy_(0, index, data[:, at:at + n])
                at += n
        self.stream.synchronize()
