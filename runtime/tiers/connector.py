"""The tiered KV connector (runtime/kv/connector.py's seam): device blocks the pool evicts are copied out
at once and written below (host memory, then disk) by a writer thread; a request whose prefix is held
below gets its blocks loaded by loader threads while other requests keep stepping.

Every block is checked on the way back (fingerprint, hash, token ids, checksum: block_file.decode); a
block that fails, a tier that fails or a load that takes longer than LOAD_TIMEOUT_S ends the load at
that block, logged and counted, and the scheduler recomputes the rest: a miss, never a wrong token.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from runtime.engine_stats import EngineStats
from runtime.kv.connector import BlockLoad
from runtime.tiers.block_file import BlockRecord, CorruptBlock, decode, encode
from runtime.tiers.block_io import BlockIO, Snapshot

log = logging.getLogger("cute_serve")
LOAD_TIMEOUT_S = 5.0  # a load slower than this (a slow or hung disk) gives up: recomputing is cheaper
PAUSE_AFTER_TIMEOUT_S = 30.0  # then no load starts for a while: a hung read holds a loader thread until it returns
INLINE_LOAD_BLOCKS = 256  # on the CPU, a host-memory load this small (~0.3 ms a block) is copied at once: the
# request joins this step instead of waiting aside for the next, and the others wait at most ~80 ms
LOAD_GROUP = 16  # blocks read, then copied into the cache together (a group's copy is one op per tensor)
WRITE_QUEUE_BLOCKS = 256  # evicted blocks waiting for the writer; past it they are dropped (counted)


class Tier(Protocol):
    """A store below the pool (host_tier.py, disk_tier.py): encoded blocks by their prefix hash."""
    name: str
    used: int  # bytes held
    budget: int  # bytes it may hold
    inline: bool  # a read never waits on a device (host memory): a CPU engine may load from it at once
    checksummed: bool  # its bytes can change outside this process (a file): a read rechecks the payload's CRC

    def __len__(self) -> int: ...  # blocks held
    def contains(self, block_hash: int) -> bool: ...
    def read(self, block_hash: int) -> bytes | bytearray | None: ...
    def write(self, block_hash: int, data: bytes) -> list[tuple[int, bytes]]: ...  # what falls to the tier below
    def drop(self, block_hash: int) -> None: ...
    def drain(self) -> list[tuple[int, bytes]]: ...  # what must go to the tiers below at shutdown
    def close(self) -> None: ...
    def describe(self) -> str: ...


def drain(done: queue.Queue, wait: float = 0.0) -> list:
    """What a loader queue holds now, after waiting up to `wait` seconds for the first item."""
    out = []
    try:
        out.append(done.get(timeout=wait) if wait else done.get_nowait())
        while True:
            out.append(done.get_nowait())
    except queue.Empty:
        pass
    return out


@dataclass
class _Load:
    key: Hashable
    blocks: list[BlockLoad]
    started: float = field(default_factory=time.perf_counter)
    intact: int = 0  # leading blocks written into the cache so far
    abandoned: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock)  # one group's write vs abandonment


class TieredConnector:
    def __init__(self, io: BlockIO, fingerprint: bytes, tiers: list[Tier], stats: EngineStats) -> None:
        self.io, self.fingerprint, self.tiers, self.stats = io, fingerprint, tiers, stats  # counters: stats.tiers
        self._counting = threading.Lock()
        self._loads: dict[Hashable, _Load] = {}
        self._paused_until = 0.0
        self._done: queue.Queue[_Load] = queue.Queue()
        self._loader = ThreadPoolExecutor(2, thread_name_prefix="kv-tier-load")
        self._writes: queue.Queue[tuple[int, tuple[int, ...], Snapshot] | None] = queue.Queue(WRITE_QUEUE_BLOCKS)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tier-write", daemon=True)
        self._writer.start()

    def _count(self, name: str, n: float = 1) -> None:
        with self._counting:  # the step thread, the loaders and the writer all count
            counters = self.stats.tiers
            counters[name] = counters.get(name, 0) + n

    # -- the seam ---------------------------------------------------------------------------------

    def lookup(self, hashes: list[int], transfer: dict | None = None) -> int:
        if time.perf_counter() < self._paused_until:  # a tier hung lately: recompute rather than queue behind it
            self._count("lookups_paused")
            return 0
        n = next((i for i, h in enumerate(hashes) if not self.holds(h)), len(hashes))
        self._count("lookup_blocks", len(hashes))
        return n

    def gauges(self) -> dict[str, float]:
        out = {}
        for t in self.tiers:  # capacity in blocks: the budget over one encoded block's bytes
            out |= {f"{t.name}_used_bytes": t.used, f"{t.name}_capacity_bytes": t.budget,
                    f"{t.name}_used_blocks": len(t), f"{t.name}_capacity_blocks": t.budget // self.io.block_bytes}
        return out

    def holds(self, block_hash: int) -> bool:
        return any(t.contains(block_hash) for t in self.tiers)

    def load(self, key: Hashable, blocks: list[BlockLoad], transfer: dict | None = None) -> None:
        job = self._loads[key] = _Load(key, blocks)
        if self.io.on_host and len(blocks) <= INLINE_LOAD_BLOCKS and all(
                any(t.inline and t.contains(h) for t in self.tiers) for _, h, _ in blocks):
            self._count("inline_loads")
            self._run_load(job)  # memory to memory: done before the step would have ended
        else:
            self._loader.submit(self._run_load, job)

    def request_finished(self, transfer: dict, blocks: list[BlockLoad]) -> dict | None:
        return None  # the tiers keep blocks by their prefix, not by request

    def finished(self, wait: float = 0.0) -> list[tuple[Hashable, int]]:
        done = drain(self._done, wait)
        now = time.perf_counter()
        for job in list(self._loads.values()):
            if job not in done and now - job.started > LOAD_TIMEOUT_S:
                with job.guard:  # at most one group's copy waits: the slow part, the read, is outside
                    job.abandoned = True
                log.warning("KV tiers: a load took over %.0f s; the rest of its prefix is recomputed, and no "
                            "load starts for %.0f s", LOAD_TIMEOUT_S, PAUSE_AFTER_TIMEOUT_S)
                self._count("load_timeouts")
                self._paused_until = now + PAUSE_AFTER_TIMEOUT_S
                done.append(job)
        out = []
        for job in done:
            if self._loads.get(job.key) is job:  # not a load abandoned earlier for the same sequence
                self._count("load_seconds", now - job.started)
                self._count("loads")
                del self._loads[job.key]
                out.append((job.key, job.intact))
        return out

    def offer(self, block: int, block_hash: int, tokens: tuple[int, ...], wait: bool = False) -> None:
        """Copy an evicted block out now (the pool reuses it next) and queue it for the tiers; a full
        queue drops it (counted) rather than stall the step, unless wait."""
        if self.holds(block_hash):
            return
        snapshot = self.io.snapshot(block)  # before the pool hands the block out again
        try:
            self._writes.put((block_hash, tokens, snapshot), block=wait)
        except queue.Full:
            self._count("writes_dropped")

    # -- the threads ------------------------------------------------------------------------------

    def _run_load(self, job: _Load) -> None:
        try:
            for at in range(0, len(job.blocks), LOAD_GROUP):
                group = job.blocks[at:at + LOAD_GROUP]
                payloads = []
                for _, block_hash, tokens in group:
                    if (payload := self._fetch(block_hash, tokens)) is None:
                        break
                    payloads.append(payload)
                with job.guard:
                    if job.abandoned or not payloads:
                        break
                    self.io.write([block for block, _, _ in group[:len(payloads)]], payloads)
                    job.intact += len(payloads)
                if len(payloads) < len(group):  # a miss: the rest is recomputed
                    break
            self._count("loaded_blocks", job.intact)
        except Exception:  # a bug or a device error: the load ends, the scheduler recomputes
            log.exception("KV tiers: a load failed")
            self._count("load_failures")
        self._done.put(job)

    def _fetch(self, block_hash: int, tokens: tuple[int, ...]) -> memoryview | None:
        for tier in self.tiers:
            data = tier.read(block_hash) if tier.contains(block_hash) else None
            if data is None:
                continue
            try:
                record = decode(data, self.fingerprint, block_hash, tokens, tier.checksummed)
            except CorruptBlock as exc:
                log.warning("KV %s tier: block %032x %s; recomputing it", tier.name, block_hash, exc)
                tier.drop(block_hash)
                self._count("corrupt_blocks")
                continue
            self._count(f"{tier.name}_hits")
            self._count(f"{tier.name}_read_bytes", len(data))
            return record.payload
        return None

    def _write_loop(self) -> None:
        _lower_priority()  # on a CPU engine the step's threads own the cores: write in their gaps
        while (item := self._writes.get()) is not None:
            try:
                self._encode_and_store(*item)
            except Exception:
                log.exception("KV tiers: writing a block failed")
                self._count("write_failures")
            finally:
                self._writes.task_done()
        self._writes.task_done()

    def _encode_and_store(self, block_hash: int, tokens: tuple[int, ...], snapshot: Snapshot) -> None:
        start = time.perf_counter()
        self._store(block_hash, encode(BlockRecord(self.fingerprint, block_hash, tokens, snapshot.bytes())))
        self._count("store_seconds", time.perf_counter() - start)

    def _store(self, block_hash: int, data: bytes, below: int = 0) -> None:
        pending = [(block_hash, data)]
        for tier in self.tiers[below:]:  # a tier takes what comes; what it lets go falls to the next
            fallen = []
            for h, d in pending:
                if tier.contains(h):  # held already (offered twice before the first write landed)
                    continue
                out = tier.write(h, d)
                if h not in {f for f, _ in out}:
                    self._count(f"{tier.name}_written_bytes", len(d))
                elif tier is self.tiers[-1]:  # refused by the last tier (a full or failing disk): lost
                    self._count("write_failures")
                fallen += out
            pending = fallen
            if not pending:
                return

    def flush(self) -> None:
        """Wait until the blocks offered so far are stored (the writer runs only in the cores' idle time)."""
        self._writes.join()

    def close(self, cached: list[BlockLoad]) -> None:
        """Write out the cached blocks still on the device and those in host memory to the tiers that
        outlive the process (a restart finds them there), then stop the threads."""
        for block, block_hash, tokens in cached:
            self.offer(block, block_hash, tokens, wait=True)
        self.flush()
        for i, tier in enumerate(self.tiers[:-1]):
            for block_hash, data in tier.drain():
                self._store(block_hash, data, below=i + 1)
        self._writes.put(None)
        self._loader.shutdown(wait=True)
        for tier in self.tiers:
            tier.close()


def _lower_priority() -> None:
    """The calling thread in Linux's idle scheduling class (nice 19 where there is none): it runs on a core
    the engine's threads leave free. At nice 19 it still took a share of a core they needed (no-hit
    throughput with the disk tier 0.88x off's on 2 cores). Evictions queue up meanwhile
    (WRITE_QUEUE_BLOCKS, then dropped and counted); a platform that cannot lower it writes as it is."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass
