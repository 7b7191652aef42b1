"""The process groups of one parallel engine, held by the engine rather than registered as
torch.distributed's global default group, so one process may run several such engines.

Where the ranks meet: spawned ranks (one machine) share a file store in a temporary folder (no port
to pick or race for); ranks a launcher started (torchrun, or anything that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT) meet at a TCP store at MASTER_ADDR:MASTER_PORT, the one torchrun's agent
already hosts when it set TORCHELASTIC_USE_AGENT_STORE. Every rank counts itself in, and none goes on
until all have, or the join timeout ends the wait with the ranks that never came.

Three groups: `compute`, a stage's TP ranks, for the model's collectives (NCCL on CUDA, gloo on the CPU);
`pipe`, every rank, for a stage's activations to the next and the last stage's logits to rank 0 (same
backend); both with a timeout so a hung rank fails a step instead of blocking it forever. `control`,
gloo, every rank, for rank 0's step messages, with no timeout worth the name, since a worker waits
there through any idle stretch (it leaves when rank 0 says stop, or when rank 0's end closes).
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from runtime.errors import UserError
from runtime.parallel.plan import Layout

COLLECTIVE_TIMEOUT_S = 120.0
JOIN_TIMEOUT_S = 600.0  # building a large shard on a slow disk
IDLE_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class GroupSpec:
    layout: Layout
    backend: str  # "gloo" or "nccl"
    store_dir: str | None = None  # spawned ranks: a file store here
    address: tuple[str, int] | None = None  # launched ranks: a TCP store there
    agent_store: bool = False  # the launcher's agent hosts the TCP store: rank 0 is a client too
    key: str = ""  # this run's keys in a store that outlives it (torchrun's run id and restart count)
    timeout_s: float = COLLECTIVE_TIMEOUT_S
    join_timeout_s: float = JOIN_TIMEOUT_S

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @classmethod
    def create(cls, layout: Layout, device: torch.device, join_timeout_s: float = JOIN_TIMEOUT_S) -> "GroupSpec":
        """Spawned ranks on this machine."""
        return cls(layout, backend_for(device), store_dir=tempfile.mkdtemp(prefix="cute-serve-tp-"),
                   join_timeout_s=join_timeout_s)

    def remove(self) -> None:
        if self.store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}" if self.address else "the spawned ranks' file store"


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r runs on the r-th GPU after rank 0's (the CPU for every rank on the CPU)."""
    if device.type != "cuda":
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise UserError(f"model parallelism from {device} needs GPU {index} for rank {rank}, but "
                        f"{torch.cuda.device_count()} are visible")
    return torch.device("cuda", index)


def _new_group(backend: str, store: dist.Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _open_store(spec: GroupSpec, rank: int) -> dist.Store:
    if spec.store_dir is not None:
        return dist.FileStore(os.path.join(spec.store_dir, "store"), spec.world_size)
    host, port = spec.address
    try:
        store = dist.TCPStore(host, port, spec.world_size, is_master=rank == 0 and not spec.agent_store,
                              timeout=timedelta(seconds=spec.join_timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:  # rank 0 (or the agent) never listened there
        raise UserError(f"rank {rank} of {spec.world_size} cannot reach the store at {host}:{port} within "
                              f"{spec.join_timeout_s:.0f} s: {str(exc).splitlines()[0][:160]}") from None
    return dist.PrefixStore(f"cute-serve/{spec.key}", store)


def _join(store: dist.Store, spec: GroupSpec, rank: int) -> None:
    """Count this rank in, then wait for the rest (bounded)."""
    store.add("joined", 1)
    deadline = time.monotonic() + spec.join_timeout_s
    while (joined := store.add("joined", 0)) < spec.world_size:
        if time.monotonic() > deadline:
            raise UserError(f"rank {rank}: only {joined} of {spec.world_size} ranks joined at {spec.where()} "
                                  f"within {spec.join_timeout_s:.0f} s (is every node's launcher started?)")
        time.sleep(0.05)


class ParallelGroup:
    """This rank's handle on the groups; the collectives the model, the pipeline and the step loop use."""

    def __init__(self, spec: GroupSpec, rank: int, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = _open_store(spec, rank)
        _join(store, spec, rank)
        layout = spec.layout
        self.rank, self.world_size, self.layout = rank, spec.world_size, layout
        self.stage, self.tp_rank = layout.stage(rank), layout.tp_rank(rank)
        timeout = timedelta(seconds=spec.timeout_s)
        self.compute = _new_group(spec.backend, dist.PrefixStore(f"compute{self.stage}", store), self.tp_rank,
                                  layout.tp, timeout) if layout.tp > 1 else None
        self.control = _new_group("gloo", dist.PrefixStore("control", store), rank, spec.world_size, IDLE_TIMEOUT)
        self.pipe = _new_group(spec.backend, dist.PrefixStore("pipe", store), rank, spec.world_size,
                               timeout) if layout.pp > 1 else None

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum x over the stage's TP ranks, in place."""
        self.compute.allreduce([x]).wait()

    def all_gather(self, x: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.layout.tp)]
        self.compute.allgather([parts], [x]).wait()
        return parts

    def gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's values (the same count on each), in rank order, on every rank."""
        mine = torch.tensor(values, dtype=torch.int64)
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        self.control.allgather([parts], [mine]).wait()
        return [p.tolist() for p in parts]

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
