"""A model-parallel worker (ranks 1..N-1, spawned by rank 0 or started by a launcher on any node): build
this rank's part of the model, then run every step rank 0 broadcasts until it says stop. The worker
never samples and never decides anything."""
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

from runtime.kv.cache import KVLedger, plan_kv_cache
from runtime.model.runner import ModelRunner
from runtime.parallel.group import GroupSpec, ParallelGroup
from runtime.parallel.layers import parallelize
from runtime.parallel.pipeline import StageStep, trim_to_stage
from runtime.parallel.plan import local_config, rank_shard
from runtime.parallel.shard import shard_checkpoint, stage_checkpoint
from weights.config import ModelConfig

STOP = None  # the broadcast that ends the loop


@dataclass
class RankSpec:
    """Everything one rank needs to build its part of the model (pickled through spawn)."""

    rank: int
    config: ModelConfig  # the full model's
    tensors: dict[str, torch.Tensor]  # this rank's part of the checkpoint (rank_tensors)
    block_size: int
    device: str
    dtype: torch.dtype
    backend: str
    threads: int
    group: GroupSpec
    make_runner: Callable  # runtime.build.make_runner: what builds the rank's ModelRunner
    quantization: str | None = None  # --quantization, applied to this rank's float shard
    kv_dtype: torch.dtype | None = None  # the KV cache's element type (None: dtype); a float type

    @property
    def stage(self) -> int:
        return self.group.layout.stage(self.rank)

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.group.layout.pp - 1

    def local_config(self) -> ModelConfig:
        layout = self.group.layout
        shard = rank_shard(self.config, layout.tp_rank(self.rank), layout.tp)
        return local_config(self.config, shard, layout.layers(self.config, self.stage))

    def block_bytes(self) -> int:
        """What one KV block costs this rank (its KV heads, its stage's layers)."""
        kv_dtype = self.kv_dtype or self.dtype
        return plan_kv_cache(self.local_config(), 0, self.block_size, kv_dtype).bytes_per_token * self.block_size


def rank_tensors(cfg: ModelConfig, tensors: dict[str, torch.Tensor], group: GroupSpec,
                 rank: int) -> dict[str, torch.Tensor]:
    """One rank's copy of its part: its stage's layers, cut to its TP shard; `tensors` is left as it was."""
    layout = group.layout
    staged = stage_checkpoint(tensors, layout.layers(cfg, layout.stage(rank)))
    return shard_checkpoint(cfg, staged, rank_shard(cfg, layout.tp_rank(rank), layout.tp))


def build_rank_runner(spec: RankSpec, blocks: int | Callable[[], int]) -> tuple[ModelRunner, KVLedger]:
    """This rank's model over its own KV heads and layers with `blocks` KV blocks (a callable: asked once
    its weights are resident); it joins the others in connect()."""
    budget = (lambda: blocks() * spec.block_bytes()) if callable(blocks) else blocks * spec.block_bytes()
    runner, ledger = spec.make_runner(spec.local_config(), spec.tensors, budget, spec.block_size, spec.device,
                                      spec.dtype, spec.backend, spec.quantization, spec.kv_dtype)
    trim_to_stage(runner.model, spec.first, spec.last)
    ledger.weight_bytes = runner.model.weight_bytes()
    return runner, ledger


def connect(spec: RankSpec, runner: ModelRunner, group: ParallelGroup | None = None) -> ParallelGroup:
    """Join the groups (every rank at once; `group` when already joined) and wrap the model in the
    collectives that use them."""
    group = group or ParallelGroup(spec.group, spec.rank, torch.device(spec.device))
    layout = spec.group.layout
    if layout.tp > 1:
        parallelize(runner.model, spec.config, rank_shard(spec.config, group.tp_rank, layout.tp), group,
                    spec.first, spec.last)
    return group


def share_bytes(group: ParallelGroup, ledger: KVLedger) -> list[list[int]]:
    """Every rank's (weight bytes, KV cache bytes), in rank order, on every rank."""
    return group.gather_ints([ledger.weight_bytes, ledger.total_bytes])


def serve_steps(group: ParallelGroup, runner: ModelRunner) -> None:
    """Run rank 0's steps until it says stop."""
    step = StageStep(runner, group, group.layout.pp)
    while (micro := group.broadcast_object()) is not STOP:
        step.run(micro)


def _exit_with_parent() -> None:
    """Leave as soon as rank 0's process is gone, whatever the worker is blocked in."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def worker_main(spec: RankSpec, link: Connection) -> None:
    """A spawned rank. link: rank 0 sends the KV blocks once its own model is built (every rank holds the
    same blocks of its own heads and layers); the worker answers "ready" or why it failed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle: it tears us down
    _exit_with_parent()
    torch.set_num_threads(spec.threads)
    try:
        runner, ledger = build_rank_runner(spec, link.recv)  # weights first (beside rank 0's), then the blocks
        spec.tensors = {}
    except BaseException as exc:
        link.send(f"{type(exc).__name__}: {exc}")
        return
    link.send("ready")
    try:
        group = connect(spec, runner)
        share_bytes(group, ledger)
        serve_steps(group, runner)
    except Exception:  # rank 0 gone or a collective failed: rank 0 sees it from its side
        traceback.print_exc(file=sys.stderr)
        sys.exit(1)
    sys.stderr.flush()
    os._exit(0)  # stopped: leave without tearing the groups down under gloo's threads (a C++ terminate)
