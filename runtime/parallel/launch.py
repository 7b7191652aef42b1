"""Ranks a launcher started (vLLM's external-launcher mode): torchrun, on one node or several, starts
the same `python -m runtime.serve ...` as every rank and sets its rendezvous in the environment (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Rank 0 builds the engine, schedules and serves
HTTP; every other rank runs headless: it builds its part of the model and runs the steps rank 0
sends, until rank 0 stops or goes away.

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr HOST --master-port 29500 \\
        -m runtime.serve --model M --tensor-parallel-size 1 --pipeline-parallel-size 2   # node 1: --node-rank 1
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from runtime.errors import UserError
from runtime.parallel.group import GroupSpec, backend_for
from runtime.parallel.plan import Layout, usable_cores


@dataclass(frozen=True)
class Launch:
    """This process's place in a launched world."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master: tuple[str, int]
    agent_store: bool  # torchrun's agent already hosts the store at the master address
    key: str  # this run's keys in that store


def _int(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    text = env.get(name, default)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UserError(f"the launcher's {name} must be an integer, got {text!r}") from None


def from_env(backend: str, env: Mapping[str, str] = os.environ) -> Launch | None:
    """The launch the environment describes (None: this process is the only rank it knows, spawn the rest).
    backend: --distributed-executor-backend."""
    if backend == "mp" or (backend == "auto" and not ("RANK" in env and "WORLD_SIZE" in env)):
        return None
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(k)]
    if missing:
        raise UserError(f"--distributed-executor-backend external_launcher needs {', '.join(missing)} in the "
                        f"environment (torchrun sets them)")
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if not 0 <= rank < world:
        raise UserError(f"the launcher's RANK {rank} is not in 0..WORLD_SIZE-1 ({world})")
    key = f"{env.get('TORCHELASTIC_RUN_ID', 'run')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return Launch(rank, world, _int(env, "LOCAL_RANK", "0"), _int(env, "LOCAL_WORLD_SIZE", "1"),
                  (env["MASTER_ADDR"], _int(env, "MASTER_PORT")),
                  env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", key)


def check_world(launch: Launch, layout: Layout) -> None:
    """The launcher's world must be the flags' TP x PP ranks."""
    if launch.world_size != layout.world_size:
        raise UserError(f"the launcher started {launch.world_size} ranks (WORLD_SIZE), but --tensor-parallel-size "
                        f"{layout.tp} x --pipeline-parallel-size {layout.pp} needs {layout.world_size}")


def group_spec(launch: Launch, layout: Layout, device: torch.device, join_timeout_s: float) -> GroupSpec:
    return GroupSpec(layout, backend_for(device), address=launch.master, agent_store=launch.agent_store,
                     key=launch.key, join_timeout_s=join_timeout_s)


def local_device(launch: Launch, device: torch.device) -> torch.device:
    """A launched rank's device: the LOCAL_RANK-th GPU of its node (the CPU stays the CPU)."""
    if device.type != "cuda":
        return device
    if launch.local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK {launch.local_rank} needs GPU {launch.local_rank}, but "
                        f"{torch.cuda.device_count()} are visible on this node")
    return torch.device("cuda", launch.local_rank)


def set_threads(launch: Launch) -> None:
    """The ranks of one node share its cores (unless OMP_NUM_THREADS says how many each takes)."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, usable_cores() // launch.local_world_size))
