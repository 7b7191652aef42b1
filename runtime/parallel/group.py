"""The process groups of one tensor-parallel engine, made from a file store (no port to pick or race for)
and held by the engine rather than registered as torch.distributed's global default group, so one
process may run several such engines, one after another or at once.

Two groups: `compute` for the model's collectives (NCCL on CUDA, gloo on the CPU), with a timeout so a
hung rank fails a step instead of blocking it forever; `control`, gloo, for rank 0's step messages,
with no timeout worth the name, since a worker waits there through any idle stretch (it leaves when
rank 0 says stop, or when rank 0's end closes the connection).
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from runtime.errors import UserError

COLLECTIVE_TIMEOUT_S = 120.0
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class GroupSpec:
    store_dir: str
    world_size: int
    backend: str  # "gloo" or "nccl"
    timeout_s: float = COLLECTIVE_TIMEOUT_S

    @classmethod
    def create(cls, world_size: int, device: torch.device) -> "GroupSpec":
        return cls(tempfile.mkdtemp(prefix="cute-serve-tp-"), world_size, "nccl" if device.type == "cuda" else "gloo")

    def remove(self) -> None:
        shutil.rmtree(self.store_dir, ignore_errors=True)


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r runs on the r-th GPU after rank 0's (the CPU for every rank on the CPU)."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise UserError(f"tensor parallelism from {device} needs GPU {index} for rank {rank}, but "
                        f"{torch.cuda.device_count()} are visible")
    return torch.device("cuda", index)


def _new_group(backend: str, store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


class TPGroup:
    """This rank's handle on both groups; the collectives the model and the step loop use."""

    def __init__(self, spec: GroupSpec, rank: int, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.FileStore(os.path.join(spec.store_dir, "store"), spec.world_size)
        self.rank, self.world_size = rank, spec.world_size
        self.compute = _new_group(spec.backend, dist.PrefixStore("compute", store), rank, spec.world_size,
                                  timedelta(seconds=spec.timeout_s))
        self.control = _new_group("gloo", dist.PrefixStore("control", store), rank, spec.world_size, IDLE_TIMEOUT)

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum x over the ranks, in place."""
        self.compute.allreduce([x]).wait()

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.compute.allgather([parts], [x]).wait()
        return parts

    def _broadcast(self, t: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.control.broadcast([t], options).wait()

    def broadcast_object(self, message: Any = None) -> Any:
        """Rank 0 sends message (pickled: its length, then its bytes); every other rank returns it."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
            self._broadcast(torch.tensor([data.numel()], dtype=torch.int64))
            self._broadcast(data)
            return message
        size = torch.zeros(1, dtype=torch.int64)
        self._broadcast(size)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        self._broadcast(data)
        return pickle.loads(data.numpy().tobytes())
