"""The KV-transfer connector (runtime/kv/connector.py's seam) of a disaggregated pair.

Prefill side: a request sent with {"do_remote_decode": true} finishes with its computed prompt blocks
copied out of the pool and held (held.py); its answer's kv_transfer_params say where they are
(remote_host, remote_port, remote_request_id, as vLLM's NixlConnector answers).
Decode side: a request carrying those params back ({"do_remote_prefill": true, ...}) offers all its
prefix blocks past the local prefix cache; a loader thread fetches them over TCP while other requests
keep stepping, checks every block (fingerprint, hash, token ids, checksum: block_file.decode) and copies
the intact ones into the pool. A refused connection, a stall past --kv-transfer-timeout, a broken or
corrupt stream, or blocks the prefill side no longer holds end the load at the last good block, logged
and counted: the scheduler recomputes the rest. A wrong block is never used.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from runtime.engine_stats import EngineStats
from runtime.kv.connector import BlockLoad
from runtime.tiers.block_file import CorruptBlock, decode
from runtime.tiers.block_io import BlockIO
from runtime.tiers.connector import drain
from runtime.tiers.kv_transfer.block_server import BlockServer
from runtime.tiers.kv_transfer.held import HeldBlocks
from runtime.tiers.kv_transfer.wire import TransferError, recv_frame, request_line

log = logging.getLogger("cute_serve")
LOAD_GROUP = 16  # blocks verified, then copied into the pool together
# the nixl_* histograms' buckets (metric_defs names the same): seconds of one transfer, bytes of one
XFER_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
XFER_BYTES_BUCKETS = tuple(float(1 << k) for k in range(14, 34, 2))  # 16 KiB .. 4 GiB


@dataclass
class _Fetch:
    key: Hashable
    blocks: list[BlockLoad]
    source: tuple[str, int, str]  # (host, port, remote request id)
    intact: int = 0
    started: float = field(default_factory=time.perf_counter)


class TransferConnector:
    def __init__(self, io: BlockIO, fingerprint: bytes, stats: EngineStats, serve_at: tuple[str, int] | None,
                 transfer_timeout: float, hold_timeout: float) -> None:
        self.io, self.fingerprint, self.stats, self.timeout = io, fingerprint, stats, transfer_timeout
        self.engine_id = uuid.uuid4().hex
        self._counting = threading.Lock()
        self._fetched: set[str] = set()  # remote request ids a load was started for (at most one each)
        self._done: queue.Queue[_Fetch] = queue.Queue()
        self._loader = ThreadPoolExecutor(2, thread_name_prefix="kv-transfer-fetch")
        self.held = HeldBlocks(hold_timeout, self._count)
        self.server = BlockServer(*serve_at, self.held, fingerprint, self._count) if serve_at else None

    def _count(self, name: str, n: float = 1) -> None:
        with self._counting:
            counters = self.stats.tiers
            counters[name] = counters.get(name, 0) + n

    def _observe(self, name: str, value: float, buckets: tuple[float, ...]) -> None:
        """One observation of a histogram kept as counters: {name}_sum, _count and cumulative _le_{i}."""
        self._count(f"{name}_sum", value)
        self._count(f"{name}_count")
        for i, bound in enumerate(buckets):
            if value <= bound:
                self._count(f"{name}_le_{i}")

    # -- the seam ---------------------------------------------------------------------------------

    def lookup(self, hashes: list[int], transfer: dict | None = None) -> int:
        source = _source(transfer)
        return len(hashes) if source is not None and source[2] not in self._fetched else 0

    def load(self, key: Hashable, blocks: list[BlockLoad], transfer: dict | None = None) -> None:
        source = _source(transfer)
        self._fetched.add(source[2])
        self._loader.submit(self._run_fetch, _Fetch(key, blocks, source))

    def finished(self, wait: float = 0.0) -> list[tuple[Hashable, int]]:
        return [(job.key, job.intact) for job in drain(self._done, wait)]

    def request_finished(self, transfer: dict, blocks: list[BlockLoad]) -> dict | None:
        source = _source(transfer)
        if source is not None:  # a decode request: the prefill side may drop its blocks now
            if source[2] not in self._fetched:
                self._loader.submit(self._release, source)
            self._fetched.discard(source[2])
            return None
        if not transfer.get("do_remote_decode") or self.server is None:
            return None
        request_id = uuid.uuid4().hex
        snapshots = {h: (tokens, self.io.snapshot(b)) for b, h, tokens in blocks}  # copied before the pool reuses them
        self.held.hold(request_id, snapshots, len(snapshots) * self.io.block_bytes)
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_block_ids": [b for b, _, _ in blocks], "remote_host": self.server.host,
                "remote_port": self.server.port, "remote_request_id": request_id, "tp_size": 1}

    def gauges(self) -> dict[str, float]:
        held, nbytes = self.held.levels()
        return {"transfer_held_requests": held, "transfer_held_bytes": nbytes}

    def holds(self, block_hash: int) -> bool:
        return False  # nothing of its own below the pool

    def offer(self, block: int, block_hash: int, tokens: tuple[int, ...]) -> None:
        pass  # evicted blocks are the pool's business: a held prompt was copied out as it finished

    # -- the loader threads -----------------------------------------------------------------------

    def _run_fetch(self, job: _Fetch) -> None:
        host, port, remote_id = job.source
        received = 0
        try:
            with socket.create_connection((host, port), timeout=self.timeout) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(request_line(remote_id, [h for _, h, _ in job.blocks]))
                received = self._receive(sock, job)
            if job.intact < len(job.blocks):
                raise TransferError(f"the prefill instance had {job.intact} of {len(job.blocks)} blocks "
                                    "(expired, or fetched already)")
        except (OSError, TransferError, CorruptBlock) as exc:
            why = "stalled" if isinstance(exc, socket.timeout) else str(exc) or type(exc).__name__
            log.warning("KV transfer from %s:%d failed after %d of %d blocks (%s); recomputing the rest", host, port,
                        job.intact, len(job.blocks), why)
            self._count("transfer_failures")
            self._count("transfer_recomputed_blocks", len(job.blocks) - job.intact)
        except Exception:  # a bug or a device error: the load ends, the scheduler recomputes
            log.exception("KV transfer: a fetch failed")
            self._count("transfer_failures")
        seconds = time.perf_counter() - job.started
        self._observe("xfer_seconds", seconds, XFER_TIME_BUCKETS)
        self._observe("xfer_bytes", received, XFER_BYTES_BUCKETS)
        self._count("transfer_loaded_blocks", job.intact)
        self._done.put(job)

    def _receive(self, sock: socket.socket, job: _Fetch) -> int:
        """Read, check and copy in the job's blocks in order; bytes received. Raises at the first bad one."""
        received, at = 0, 0
        while at < len(job.blocks):
            group, payloads = job.blocks[at:at + LOAD_GROUP], []
            try:
                for _, block_hash, tokens in group:
                    data = recv_frame(sock)
                    if data is None:
                        break
                    received += len(data) + 8
                    payloads.append(decode(data, self.fingerprint, block_hash, tokens).payload)
            finally:  # the blocks checked before a bad one are good: they stay
                if payloads:
                    self.io.write([b for b, _, _ in group[:len(payloads)]], payloads)
                    job.intact += len(payloads)
            if len(payloads) < len(group):
                return received
            at += len(group)
        if recv_frame(sock) is not None:
            raise TransferError("the prefill instance sent more blocks than asked for")
        return received

    def _release(self, source: tuple[str, int, str]) -> None:
        host, port, remote_id = source
        try:
            with socket.create_connection((host, port), timeout=self.timeout) as sock:
                sock.sendall(request_line(remote_id, []))
        except OSError as exc:
            log.info("KV transfer: could not release request %s at %s:%d (%s); it expires there", remote_id, host,
                     port, exc)

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)
        if self.server is not None:
            self.server.close()


def _source(transfer: dict | None) -> tuple[str, int, str] | None:
    """Where a decode request's blocks are, from its kv_transfer_params (the server checked their types)."""
    if not transfer or not transfer.get("do_remote_prefill"):
        return None
    host, port, remote_id = (transfer.get(k) for k in ("remote_host", "remote_port", "remote_request_id"))
    return (host, int(port), str(remote_id)) if host and port and remote_id else None  # else: nothing to fetch
