"""Process groups of a tensor-parallel engine: one for the model's collectives (NCCL on CUDA, gloo on
the CPU, with a timeout so a hung rank fails instead of blocking forever) and a gloo one for rank 0's
step messages (no timeout worth the name: a worker may wait there through any idle stretch; it leaves
when rank 0 closes the group or dies). Rendezvous through a file, so no port is picked or raced for.
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
        if dist.is_initialized():
            raise UserError("this process already runs a tensor-parallel engine (torch.distributed is initialized); "
                            "close it first")
        return cls(tempfile.mkdtemp(prefix="cute-serve-tp-"), world_size, "nccl" if device.type == "cuda" else "gloo")


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r runs on the r-th GPU after rank 0's (the CPU for every rank on the CPU)."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise UserError(f"tensor parallelism over {rank + 1}+ ranks from {device} needs GPU {index}, but "
                        f"{torch.cuda.device_count()} are visible")
    return torch.device("cuda", index)


def join(spec: GroupSpec, rank: int, device: torch.device) -> dist.ProcessGroup:
    """Join both groups; returns the control group (the model's collectives use the default group)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(os.path.join(spec.store_dir, "store"), spec.world_size)
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world_size,
                            timeout=timedelta(seconds=spec.timeout_s))
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


def leave(spec: GroupSpec, rank: int) -> None:
    """Destroy the groups (best effort: a dead peer may leave them half-broken); rank 0 removes the store."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    if rank == 0:
        shutil.rmtree(spec.store_dir, ignore_errors=True)


def broadcast(message: Any, control: dist.ProcessGroup) -> Any:
    """Rank 0 sends message to every worker in one broadcast; a worker passes None and gets it."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]


def message_bytes(message: Any) -> int:
    return len(pickle.dumps(message))
