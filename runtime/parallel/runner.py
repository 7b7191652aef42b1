"""Rank 0's side of tensor parallelism: spawn the workers, send each step's chunks in one broadcast, run
rank 0's own shard, and fail fast (never hang) when a worker dies.

The engine sees a Runner (runtime/model/runner.py): prepare() then forward() -> full-vocabulary
logits of the rows to sample. A dead worker is found before each step (its process sentinel) or by the collective
that loses it (gloo reports the closed connection at once; a hung rank hits the group's timeout); either
way the runner kills the rest and raises EngineDeadError from then on. close() stops every worker.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import time
import weakref
from collections.abc import Callable, Iterable
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp

from runtime.errors import EngineDeadError
from runtime.kv.cache import KVLedger
from runtime.model.runner import ModelRunner, Prepared
from runtime.parallel.group import GroupSpec, TPGroup, rank_device
from runtime.parallel.layers import COMM
from runtime.parallel.plan import rank_shard, threads_per_rank
from runtime.parallel.shard import shard_checkpoint
from runtime.parallel.worker import STOP, RankSpec, build_rank_runner, connect, worker_main
from runtime.sequence import SeqChunk
from weights.config import ModelConfig

log = logging.getLogger("cute_serve")

START_TIMEOUT_S = 600.0  # building a large shard on a slow disk
STOP_TIMEOUT_S = 5.0
_LIVE: "weakref.WeakSet[TensorParallelRunner]" = weakref.WeakSet()


def _exit_status(process: mp.Process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class TensorParallelRunner:
    def __init__(self, inner: ModelRunner, workers: list[mp.Process], spec: GroupSpec, tp: TPGroup,
                 threads_before: int, ledger: KVLedger) -> None:
        self.inner = inner
        self.ledger = ledger
        self.workers = workers
        self.spec = spec
        self.tp: TPGroup | None = tp
        self.error: EngineDeadError | None = None
        self._threads_before = threads_before
        self.closed = False
        _LIVE.add(self)

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def local(self) -> ModelRunner:
        """Rank 0's own shard."""
        return self.inner

    def prepare(self, chunks: list[SeqChunk]) -> tuple[list[SeqChunk], Prepared]:
        return chunks, self.inner.prepare(chunks)  # the chunks go to the workers: each prepares the same

    def forward(self, prepared: tuple[list[SeqChunk], Prepared]) -> torch.Tensor:
        chunks, local = prepared
        self.check_workers()
        try:
            t0 = time.perf_counter()
            self.tp.broadcast_object(chunks)
            COMM.broadcast_seconds += time.perf_counter() - t0
            return self.inner.forward(local)
        except RuntimeError as exc:  # a collective lost a rank (or timed out)
            time.sleep(0.2)  # let a dying worker's exit code settle, for the message
            dead = self._dead_workers()
            self._fail(dead[0] if dead else f"rank 0's step failed ({str(exc).splitlines()[0][:200]})")

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        return self.forward(self.prepare(chunks))

    def describe(self) -> dict[str, str]:
        per_rank = self.ledger.weight_bytes + self.ledger.total_bytes
        return {**self.inner.describe(),
                "tensor parallel": f"{self.world_size} ranks, {per_rank / 2**20:.1f} MiB each (weights + KV cache)"}

    def _dead_workers(self) -> list[str]:
        gone = set(wait([p.sentinel for p in self.workers], timeout=0))
        return [f"worker rank {r} (pid {p.pid}) died ({_exit_status(p)})"
                for r, p in enumerate(self.workers, 1) if p.sentinel in gone]

    def failure(self) -> str | None:
        """What stops this runner (a failure, a dead worker, close), found without acting on it."""
        if self.error is not None or self.closed:
            return str(self.error or "the tensor-parallel engine is closed")
        dead = self._dead_workers()
        return dead[0] if dead else None

    def check_workers(self) -> None:
        """Raise EngineDeadError if the engine failed before or a worker has died since the last step."""
        if self.error is not None:
            raise self.error
        if self.closed:
            raise EngineDeadError("the tensor-parallel engine is closed")
        dead = self._dead_workers()
        if dead:
            self._fail(dead[0])

    def _fail(self, why: str) -> None:
        self.error = EngineDeadError(f"tensor parallelism over {self.world_size} ranks failed: {why}; "
                                     f"the engine cannot run more steps")
        log.error("%s", self.error)
        self._teardown(graceful=False)
        raise self.error

    def close(self) -> None:
        """Stop every worker (idempotent); the engine runs no more steps."""
        if not self.closed:
            self._teardown(graceful=self.error is None)

    def __del__(self) -> None:  # an engine dropped without close(): its workers must not linger
        if not getattr(self, "closed", True):
            self._teardown(graceful=False)

    def _teardown(self, graceful: bool) -> None:
        self.closed = True
        if graceful and not self._dead_workers():
            try:
                self.tp.broadcast_object(STOP)
            except RuntimeError:
                pass
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
        for p in self.workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(STOP_TIMEOUT_S)
        self.tp = None  # drops rank 0's ends of both groups
        self.spec.remove()
        torch.set_num_threads(self._threads_before)


def _spawn(specs: Iterable[RankSpec], started: list[tuple[mp.Process, object]]) -> None:
    """Start one worker per spec (its shard goes into shared memory as the process starts)."""
    ctx = mp.get_context("spawn")
    for spec in specs:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=worker_main, args=(spec, theirs), name=f"cute-serve-tp{spec.rank}", daemon=True)
        p.start()
        theirs.close()
        started.append((p, ours))


def _await_ready(started: list[tuple[mp.Process, object]]) -> None:
    """Wait until every worker has built its shard; raise EngineDeadError if one fails or dies first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    for rank, (p, conn) in enumerate(started, 1):
        if not wait([conn, p.sentinel], timeout=max(0.0, deadline - time.monotonic())):
            raise EngineDeadError(f"tensor-parallel worker rank {rank} did not start within {START_TIMEOUT_S:.0f} s")
        if conn.poll():
            message = conn.recv()
        else:
            p.join(STOP_TIMEOUT_S)
            message = (f"died while starting ({_exit_status(p)}); a script that starts an engine when imported "
                       f"needs `if __name__ == \"__main__\":`, since spawned workers import the main script")
        if message != "ready":
            raise EngineDeadError(f"tensor-parallel worker rank {rank} failed to start: {message}")


def make_tp_runner(cfg: ModelConfig, tensors: dict[str, torch.Tensor], kv_budget: Callable[[], int],
                   block_size: int, device: torch.device, dtype: torch.dtype, backend: str,
                   world_size: int, make_runner: Callable, quantization: str | None = None,
                   ) -> tuple[TensorParallelRunner, KVLedger]:
    """Rank 0's runner over world_size ranks; consumes `tensors`. The ledger is one rank's. make_runner
    builds a rank's ModelRunner (runtime.build.make_runner; pickled by reference to the workers)."""
    spec = GroupSpec.create(world_size, device)
    threads_before = torch.get_num_threads()
    threads = threads_per_rank(world_size)
    torch.set_num_threads(threads)
    common = dict(config=cfg, block_size=block_size, dtype=dtype, backend=backend, threads=threads, group=spec,
                  make_runner=make_runner, quantization=quantization)
    started: list[tuple[mp.Process, object]] = []

    def shard(r: int) -> dict[str, torch.Tensor]:  # one rank's copy at a time: never all N at once
        return shard_checkpoint(cfg, tensors, rank_shard(cfg, r, world_size))

    try:  # the workers start first, so their start-up and weights overlap rank 0's
        _spawn((RankSpec(r, tensors=shard(r), device=str(rank_device(device, r)), **common)
                for r in range(1, world_size)), started)
        rank0 = RankSpec(0, tensors=shard(0), device=str(device), **common)
        tensors.clear()
        inner, ledger = build_rank_runner(rank0, kv_budget)
        ledger.tensor_parallel_size = world_size
        ledger.require_blocks()
        for _, link in started:
            with contextlib.suppress(OSError):  # a worker that already failed: _await_ready says why
                link.send(ledger.num_blocks * ledger.bytes_per_token * block_size)
        _await_ready(started)
        tp = connect(rank0, inner)
    except BaseException:
        for p, _ in started:
            p.kill()
            p.join(STOP_TIMEOUT_S)
        spec.remove()
        torch.set_num_threads(threads_before)
        raise
    return TensorParallelRunner(inner, [p for p, _ in started], spec, tp, threads_before, ledger), ledger


@atexit.register
def _close_all() -> None:
    for runner in list(_LIVE):
        runner.close()
