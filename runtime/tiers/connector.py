"""The tiered KV connector (runtime/kv/connector.py's seam): device blocks the pool evicts are copied out
at once and written below (host memory, then disk) by a writer thread; a request whose prefix is held
below gets its blocks loaded by loader threads while other requests keep stepping.

Every block is checked on the way back (fingerprint, hash, token ids, checksum: block_file.decode); a
block that fails, a tier that fails or a load that takes longer than LOAD_TIMEOUT_S ends the load at
that block, logged and counted, and the scheduler recomputes the rest: a miss, never a wrong token.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from runtime.engine_stats import EngineStats
from runtime.kv.connector import BlockLoad
from runtime.tiers.block_file import BlockRecord, CorruptBlock, decode, encode
from runtime.tiers.block_io import BlockIO

log = logging.getLogger("cute_serve")
LOAD_TIMEOUT_S = 5.0  # a load slower than this (a slow or hung disk) gives up: recomputing is cheaper
WRITE_QUEUE_BLOCKS = 256  # evicted blocks waiting for the writer; past it they are dropped (counted)


@dataclass
class _Load:
    key: Hashable
    blocks: list[BlockLoad]
    started: float = field(default_factory=time.perf_counter)
    intact: int = 0  # leading blocks written into the cache so far
    abandoned: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock)  # one block write vs abandonment


class TieredConnector:
    def __init__(self, io: BlockIO, fingerprint: bytes, tiers: list, stats: EngineStats) -> None:
        self.io, self.fingerprint, self.tiers, self.stats = io, fingerprint, tiers, stats  # counters: stats.tiers
        self._counting = threading.Lock()
        self._loads: dict[Hashable, _Load] = {}
        self._done: queue.Queue[_Load] = queue.Queue()
        self._loader = ThreadPoolExecutor(2, thread_name_prefix="kv-tier-load")
        self._writes: queue.Queue[tuple[int, bytes] | None] = queue.Queue(WRITE_QUEUE_BLOCKS)
        self._writer = threading.Thread(target=self._write_loop, name="kv-tier-write", daemon=True)
        self._writer.start()

    def _count(self, name: str, n: float = 1) -> None:
        with self._counting:  # the step thread, the loaders and the writer all count
            counters = self.stats.tiers
            counters[name] = counters.get(name, 0) + n

    # -- the seam ---------------------------------------------------------------------------------

    def lookup(self, hashes: list[int]) -> int:
        n = next((i for i, h in enumerate(hashes) if not any(t.contains(h) for t in self.tiers)), len(hashes))
        self._count("lookup_blocks", len(hashes))
        return n

    def load(self, key: Hashable, blocks: list[BlockLoad]) -> None:
        job = self._loads[key] = _Load(key, blocks)
        self._loader.submit(self._run_load, job)

    def finished(self, wait: float = 0.0) -> list[tuple[Hashable, int]]:
        done = []
        try:
            done.append(self._done.get(timeout=wait) if wait else self._done.get_nowait())
            while True:
                done.append(self._done.get_nowait())
        except queue.Empty:
            pass
        now = time.perf_counter()
        for job in list(self._loads.values()):
            if job not in done and now - job.started > LOAD_TIMEOUT_S:
                with job.guard:  # at most one block write waits: the slow part, the read, is outside
                    job.abandoned = True
                log.warning("KV tiers: a load took over %.0f s; the rest of its prefix is recomputed", LOAD_TIMEOUT_S)
                self._count("load_timeouts")
                done.append(job)
        out = []
        for job in done:
            if self._loads.pop(job.key, None) is not None:
                self._count("load_seconds", now - job.started)
                self._count("loads")
                out.append((job.key, job.intact))
        return out

    def offer(self, block: int, block_hash: int, tokens: tuple[int, ...], wait: bool = False) -> None:
        """Copy an evicted block out now (the pool reuses it next) and queue it for the tiers; a full
        queue drops it (counted) rather than stall the step, unless wait."""
        if any(t.contains(block_hash) for t in self.tiers):
            return
        data = encode(BlockRecord(self.fingerprint, block_hash, tokens, self.io.read(block)))
        try:
            self._writes.put((block_hash, data), block=wait)
        except queue.Full:
            self._count("writes_dropped")

    # -- the threads ------------------------------------------------------------------------------

    def _run_load(self, job: _Load) -> None:
        try:
            for block, block_hash, tokens in job.blocks:
                payload = self._fetch(block_hash, tokens)
                with job.guard:
                    if payload is None or job.abandoned:
                        break
                    self.io.write(block, payload)
                    job.intact += 1
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
                record = decode(data, self.fingerprint, block_hash, tokens)
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
        while (item := self._writes.get()) is not None:
            try:
                self._store(*item)
            except Exception:
                log.exception("KV tiers: writing a block failed")
                self._count("write_failures")
            finally:
                self._writes.task_done()
        self._writes.task_done()

    def _store(self, block_hash: int, data: bytes) -> None:
        pending = [(block_hash, data)]
        for tier in self.tiers:  # a tier takes what comes; what it evicts falls to the next
            spilled = []
            for h, d in pending:
                kept = tier.write(h, d)
                if isinstance(kept, list):  # the host tier: what it had to let go
                    spilled += kept
                    self._count(f"{tier.name}_written_bytes", len(d) * (h not in {s for s, _ in kept}))
                else:
                    self._count(f"{tier.name}_written_bytes" if kept else "write_failures", len(d) if kept else 1)
                self.stats.tiers[f"{tier.name}_used_bytes"] = tier.used
            pending = spilled
            if not pending:
                return

    def close(self, cached: list[BlockLoad]) -> None:
        """Write out the cached blocks still on the device (a restart finds them), then stop the threads."""
        for block, block_hash, tokens in cached:
            self.offer(block, block_hash, tokens, wait=True)
        self._writes.join()
        self._writes.put(None)
        self._loader.shutdown(wait=True)
        for tier in self.tiers:
            tier.close()

    def describe(self) -> str:
        return ", ".join(t.describe() for t in self.tiers)
