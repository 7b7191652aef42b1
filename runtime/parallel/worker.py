"""A tensor-parallel worker process (ranks 1..N-1): build this rank's shard, then run every step rank 0
broadcasts until it says stop. The worker never samples and never decides anything."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from runtime.kv.cache import KVLedger
from runtime.model.runner import ModelRunner
from runtime.parallel.group import GroupSpec, TPGroup
from runtime.parallel.layers import parallelize
from runtime.parallel.plan import local_config, rank_shard
from weights.config import ModelConfig

STOP = None  # the broadcast that ends the loop


@dataclass
class RankSpec:
    """Everything one rank needs to build its part of the model (pickled through spawn)."""

    rank: int
    config: ModelConfig  # the full model's
    tensors: dict[str, torch.Tensor]  # this rank's shard of the checkpoint
    block_size: int
    device: str
    dtype: torch.dtype
    backend: str
    threads: int
    group: GroupSpec
    make_runner: Callable  # runtime.build.make_runner: what builds the rank's ModelRunner
    quantization: str | None = None  # --quantization, applied to this rank's float shard


def build_rank_runner(spec: RankSpec, kv_budget: int | Callable[[], int]) -> tuple[ModelRunner, KVLedger]:
    """This rank's model over its own KV heads; it joins the others in connect()."""
    shard = rank_shard(spec.config, spec.rank, spec.group.world_size)
    return spec.make_runner(local_config(spec.config, shard), spec.tensors, kv_budget, spec.block_size,
                            spec.device, spec.dtype, spec.backend, spec.quantization)


def connect(spec: RankSpec, runner: ModelRunner) -> TPGroup:
    """Join the groups (every rank at once) and wrap the model in the collectives that use them."""
    tp = TPGroup(spec.group, spec.rank, torch.device(spec.device))
    parallelize(runner.model, spec.config, rank_shard(spec.config, spec.rank, spec.group.world_size), tp)
    return tp


def _exit_with_parent() -> None:
    """Leave as soon as rank 0's process is gone, whatever the worker is blocked in."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def worker_main(spec: RankSpec, link: Connection) -> None:
    """link: rank 0 sends the KV budget once its own model is built (exactly its blocks: every rank holds
    the same blocks of its own heads); the worker answers "ready" or why it failed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle: it tears us down
    _exit_with_parent()
    torch.set_num_threads(spec.threads)
    try:
        runner, _ = build_rank_runner(spec, link.recv)  # weights first (beside rank 0's), then the budget
        spec.tensors = {}
    except BaseException as exc:
        link.send(f"{type(exc).__name__}: {exc}")
        return
    link.send("ready")
    try:
        tp = connect(spec, runner)
        while (chunks := tp.broadcast_object()) is not STOP:
            runner.forward(runner.prepare(chunks))
    except Exception:  # rank 0 gone or a collective failed: rank 0 sees it from its side
        traceback.print_exc(file=sys.stderr)
        sys.exit(1)
