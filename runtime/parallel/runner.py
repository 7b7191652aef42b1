"""Rank 0's side of model parallelism: start (or meet) the other ranks, send each step's chunks in one
broadcast, run rank 0's own part, and fail fast (never hang) when a rank dies.

The engine sees a Runner (runtime/model/runner.py): prepare() then forward() -> full-vocabulary
logits of the rows to sample. Ranks on this machine are spawned here; ranks a launcher started
(torchrun, on any node: runtime/parallel/launch.py) are met at its store. A dead spawned worker is
found before each step (its process sentinel); any dead rank is found by the collective or message
that loses it (gloo reports the closed connection at once; a hung rank hits the group's timeout);
either way the runner kills what it spawned and raises EngineDeadError from then on. close() stops
every worker.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import re
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
from runtime.parallel.group import GroupSpec, ParallelGroup, rank_device
from runtime.parallel.layers import COMM
from runtime.parallel.pipeline import StageStep, split_micro_batches
from runtime.parallel.plan import threads_per_rank
from runtime.parallel.worker import STOP, RankSpec, build_rank_runner, connect, rank_tensors, share_bytes, worker_main
from runtime.sequence import SeqChunk
from weights.config import ModelConfig

log = logging.getLogger("cute_serve")

STOP_TIMEOUT_S = 5.0
_LIVE: "weakref.WeakSet[ParallelRunner]" = weakref.WeakSet()


def _exit_status(process: mp.Process) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class ParallelRunner:
    def __init__(self, inner: ModelRunner, workers: list[mp.Process], spec: GroupSpec, group: ParallelGroup,
                 threads_before: int, ledger: KVLedger) -> None:
        self.inner = inner
        self.ledger = ledger
        self.workers = workers  # the spawned ones (none when a launcher started the ranks)
        self.spec = spec
        self.group: ParallelGroup | None = group
        self.step = StageStep(inner, group, spec.layout.pp)
        self.error: EngineDeadError | None = None
        self._threads_before = threads_before
        self.closed = False
        _LIVE.add(self)

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    @property
    def local(self) -> ModelRunner:
        """Rank 0's own part."""
        return self.inner

    def prepare(self, chunks: list[SeqChunk]) -> tuple[list[list[SeqChunk]], Prepared | None]:
        if self.spec.layout.pp > 1:  # each micro-batch is prepared as it runs
            return split_micro_batches(chunks, self.spec.layout.pp), None
        return [chunks], self.inner.prepare(chunks)  # the chunks go to the workers: each prepares the same

    def forward(self, prepared: tuple[list[list[SeqChunk]], Prepared | None]) -> torch.Tensor:
        micro, local = prepared
        self.check_workers()
        try:
            t0 = time.perf_counter()
            self.group.broadcast_object(micro)
            COMM.broadcast_seconds += time.perf_counter() - t0
            return self.inner.forward(local) if local is not None else self.step.run(micro)
        except RuntimeError as exc:  # a collective or message lost a rank (or timed out)
            time.sleep(0.2)  # let a dying worker's exit code settle, for the message
            dead = self._dead_workers()
            self._fail(dead[0] if dead else f"rank 0's step failed ({_short(exc)})")

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        return self.forward(self.prepare(chunks))

    def describe(self) -> dict[str, str]:
        layout = self.spec.layout
        per_rank = self.ledger.weight_bytes + self.ledger.total_bytes
        text = f"{layout.tp} ranks, {per_rank / 2**20:.1f} MiB each (weights + KV cache)"
        if layout.pp > 1:
            text = f"TP {layout.tp} x PP {layout.pp} ({self.world_size} ranks; the ledger has each stage's bytes)"
        return {**self.inner.describe(), "tensor parallel": text}

    def _dead_workers(self) -> list[str]:
        gone = set(wait([p.sentinel for p in self.workers], timeout=0)) if self.workers else set()
        return [f"worker rank {r} (pid {p.pid}) died ({_exit_status(p)})"
                for r, p in enumerate(self.workers, 1) if p.sentinel in gone]

    def failure(self) -> str | None:
        """What stops this runner (a failure, a dead worker, close), found without acting on it."""
        if self.error is not None or self.closed:
            return str(self.error or "the model-parallel engine is closed")
        dead = self._dead_workers()
        return dead[0] if dead else None

    def check_workers(self) -> None:
        """Raise EngineDeadError if the engine failed before or a worker has died since the last step."""
        if self.error is not None:
            raise self.error
        if self.closed:
            raise EngineDeadError("the model-parallel engine is closed")
        dead = self._dead_workers()
        if dead:
            self._fail(dead[0])

    def _fail(self, why: str) -> None:
        layout = self.spec.layout
        self.error = EngineDeadError(f"model parallelism over {self.world_size} ranks (TP {layout.tp} x PP "
                                     f"{layout.pp}) failed: {why}; the engine cannot run more steps")
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
                self.group.broadcast_object(STOP)
            except RuntimeError:
                pass
        deadline = time.monotonic() + (STOP_TIMEOUT_S if graceful else 0.0)
        for p in self.workers:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(STOP_TIMEOUT_S)
        self.group = self.step.group = None  # drops rank 0's ends of the groups (a launched rank then sees them close)
        self.spec.remove()
        torch.set_num_threads(self._threads_before)


def _short(exc: BaseException) -> str:
    """gloo's first line without its source location and advice, e.g. "Read error [127.0.0.1]:52416:
    Connection reset by peer" (a peer rank went away)."""
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return text.split(". This is typically")[0][:200]


def _spawn(specs: Iterable[RankSpec], started: list[tuple[mp.Process, object]]) -> None:
    """Start one worker per spec (its shard goes into shared memory as the process starts)."""
    ctx = mp.get_context("spawn")
    for spec in specs:
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=worker_main, args=(spec, theirs), name=f"cute-serve-tp{spec.rank}", daemon=True)
        p.start()
        theirs.close()
        started.append((p, ours))


def _await_ready(started: list[tuple[mp.Process, object]], timeout_s: float) -> None:
    """Wait until every worker has built its shard; raise EngineDeadError if one fails or dies first."""
    deadline = time.monotonic() + timeout_s
    for rank, (p, conn) in enumerate(started, 1):
        if not wait([conn, p.sentinel], timeout=max(0.0, deadline - time.monotonic())):
            raise EngineDeadError(f"model-parallel worker rank {rank} did not start within {timeout_s:.0f} s")
        if conn.poll():
            message = conn.recv()
        else:
            p.join(STOP_TIMEOUT_S)
            message = (f"died while starting ({_exit_status(p)}); a script that starts an engine when imported "
                       f"needs `if __name__ == \"__main__\":`, since spawned workers import the main script")
        if message != "ready":
            raise EngineDeadError(f"model-parallel worker rank {rank} failed to start: {message}")


def _note_stages(ledger: KVLedger, spec: GroupSpec, shared: list[list[int]]) -> None:
    """The ledger is rank 0's; it also names each stage's bytes (its first TP rank's: the others match)."""
    layout = spec.layout
    ledger.tensor_parallel_size = layout.tp
    ledger.stage_bytes = [tuple(shared[s * layout.tp]) for s in range(layout.pp)] if layout.pp > 1 else []


def _spawned_ranks(rank0: RankSpec, specs: Iterable[RankSpec], kv_budget: Callable[[], int],
                   ) -> tuple[ModelRunner, KVLedger, list[mp.Process], ParallelGroup]:
    started: list[tuple[mp.Process, object]] = []
    try:  # the workers start first, so their start-up and weights overlap rank 0's
        _spawn(specs, started)
        inner, ledger = build_rank_runner(rank0, lambda: kv_budget() // rank0.block_bytes())
        ledger.require_blocks()
        for _, link in started:
            with contextlib.suppress(OSError):  # a worker that already failed: _await_ready says why
                link.send(ledger.num_blocks)
        _await_ready(started, rank0.group.join_timeout_s)
        group = connect(rank0, inner)
    except BaseException:
        for p, _ in started:
            p.kill()
            p.join(STOP_TIMEOUT_S)
        raise
    return inner, ledger, [p for p, _ in started], group


def _launched_ranks(rank0: RankSpec, kv_budget: Callable[[], int]) -> tuple[ModelRunner, KVLedger, ParallelGroup]:
    """The launcher started the other ranks: meet them first, so all agree on the fewest blocks any holds."""
    group = ParallelGroup(rank0.group, 0, torch.device(rank0.device))
    inner, ledger = build_rank_runner(rank0, lambda: agreed_blocks(group, kv_budget() // rank0.block_bytes()))
    return inner, ledger, connect(rank0, inner, group)


def agreed_blocks(group: ParallelGroup, mine: int) -> int:
    """The fewest KV blocks any rank's budget holds: every rank allocates that many."""
    return min(values[0] for values in group.gather_ints([mine]))


def make_parallel_runner(cfg: ModelConfig, tensors: dict[str, torch.Tensor], kv_budget: Callable[[], int],
                         block_size: int, device: torch.device, dtype: torch.dtype, backend: str, spec: GroupSpec,
                         make_runner: Callable, quantization: str | None = None, launched: bool = False,
                         kv_dtype: torch.dtype | None = None) -> tuple[ParallelRunner, KVLedger]:
    """Rank 0's runner over spec's ranks (spawned here, or `launched` elsewhere); consumes `tensors`. The
    ledger is rank 0's. make_runner builds a rank's ModelRunner (runtime.build.make_runner; pickled by
    reference to the workers)."""
    threads_before = torch.get_num_threads()
    threads = threads_per_rank(spec.world_size) if not launched else threads_before
    torch.set_num_threads(threads)
    common = dict(config=cfg, block_size=block_size, dtype=dtype, backend=backend, threads=threads, group=spec,
                  make_runner=make_runner, quantization=quantization, kv_dtype=kv_dtype)
    try:
        specs = (RankSpec(r, tensors=rank_tensors(cfg, tensors, spec, r), device=str(rank_device(device, r)),
                          **common) for r in range(1, spec.world_size))  # one rank's copy at a time
        rank0 = RankSpec(0, tensors={}, device=str(device), **common)
        workers: list[mp.Process] = []
        if launched:
            rank0.tensors = rank_tensors(cfg, tensors, spec, 0)
            tensors.clear()
            inner, ledger, group = _launched_ranks(rank0, kv_budget)
        else:
            rank0.tensors = rank_tensors(cfg, tensors, spec, 0)
            inner, ledger, workers, group = _spawned_ranks(rank0, _after_clear(specs, tensors), kv_budget)
        _note_stages(ledger, spec, share_bytes(group, ledger))
    except BaseException:
        spec.remove()
        torch.set_num_threads(threads_before)
        raise
    return ParallelRunner(inner, workers, spec, group, threads_before, ledger), ledger


def _after_clear(specs: Iterable[RankSpec], tensors: dict) -> Iterable[RankSpec]:
    """The workers' specs, then the full checkpoint dropped (rank 0 keeps only its part)."""
    yield from specs
    tensors.clear()


@atexit.register
def _close_all() -> None:
    for runner in list(_LIVE):
        runner.close()
