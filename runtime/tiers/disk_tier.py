"""The disk tier: one file per KV block under <path>/<fingerprint>/, least recently used first out of
a byte budget, kept across runs (a restarted server with the same model and settings starts warm).

A lock file keeps a second server off the same directory (a clear start-up error); a full disk or a
vanished permission costs the block (logged, counted), never the request."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from runtime.errors import UserError

log = logging.getLogger("cute_serve")


class DiskTier:
    name = "disk"
    inline = False
    checksummed = True

    def __init__(self, root: str, budget_bytes: int, fingerprint: bytes) -> None:
        self.dir = Path(root) / fingerprint.hex()
        self.budget = budget_bytes
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock = open(self.dir / ".lock", "a+")  # noqa: SIM115  (held for the server's life)
            (self.dir / ".probe").write_bytes(b"")
        except OSError as exc:
            raise UserError(f"--kv-disk-path {root}: cannot write {self.dir} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise UserError(f"--kv-disk-path {root}: another server uses it for this model and settings; stop it "
                            "or give this one a path of its own") from None
        self.guard = threading.Lock()  # the index: the writer and loader threads share it
        self.index: OrderedDict[int, int] = OrderedDict()  # block hash -> file bytes, least recent first
        self.used = 0
        for block_hash, size in _stored_blocks(self.dir):
            self.index[block_hash] = size
            self.used += size
        for tmp in self.dir.glob("*.tmp"):  # a write a crash cut short
            tmp.unlink(missing_ok=True)
        with self.guard:
            self._shrink_to(self.budget)
        self.failed: set[int] = set()  # errno of write failures already logged

    def _path(self, block_hash: int) -> Path:
        return self.dir / f"{block_hash:032x}.kvb"

    def __len__(self) -> int:
        return len(self.index)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self.index

    def read(self, block_hash: int) -> bytearray | None:
        path = self._path(block_hash)
        try:
            with open(path, "rb", buffering=0) as f:  # one read into one buffer (read() then a copy: 10x slower)
                data = bytearray(os.fstat(f.fileno()).st_size)
                del data[f.readinto(data) or 0:]  # shorter if it shrank meanwhile: decode() says truncated
            os.utime(path)  # most recently used: the LRU order survives a restart
        except OSError:
            self.drop(block_hash)
            return None
        with self.guard:
            if block_hash in self.index:
                self.index.move_to_end(block_hash)
        return data

    def write(self, block_hash: int, data: bytes) -> list[tuple[int, bytes]]:
        """Store a block's file (the writer thread); the block back where the disk would not take it (what
        the budget evicts is deleted: nothing lies below the disk)."""
        if block_hash in self.index or len(data) > self.budget:
            return [] if block_hash in self.index else [(block_hash, data)]
        path = self._path(block_hash)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)  # never a torn file under the block's name
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno not in self.failed:
                self.failed.add(exc.errno)
                log.warning("KV disk tier: writing %s failed (%s); blocks that do not fit are recomputed",
                            self.dir, errno.errorcode.get(exc.errno, exc))
            return [(block_hash, data)]
        with self.guard:
            self.index[block_hash] = len(data)
            self.used += len(data)
            self._shrink_to(self.budget)
        return []

    def drop(self, block_hash: int) -> None:
        """Forget a block (its file is corrupt or gone)."""
        with self.guard:
            size = self.index.pop(block_hash, None)
            self.used -= size or 0
        self._path(block_hash).unlink(missing_ok=True)

    def _shrink_to(self, budget: int) -> None:
        while self.used > budget and self.index:
            block_hash, size = self.index.popitem(last=False)
            self.used -= size
            self._path(block_hash).unlink(missing_ok=True)

    def drain(self) -> list[tuple[int, bytes]]:
        return []  # the disk outlives the process: nothing to hand down at shutdown

    def close(self) -> None:
        """Let another server have the directory (the lock goes with the file)."""
        self._lock.close()

    def describe(self) -> str:
        return f"disk {self.budget / 2**30:.1f} GiB at {self.dir.parent} ({len(self.index)} blocks kept)"


def _stored_blocks(directory: Path) -> list[tuple[int, int]]:
    """(block hash, file bytes) of the block files there, least recently used first; a file of another
    name is left alone, one that vanishes meanwhile is skipped."""
    found = []
    for f in directory.glob("*.kvb"):
        try:
            block_hash, stat = int(f.stem, 16), f.stat()
        except (ValueError, OSError):
            continue
        found.append((stat.st_mtime, block_hash, stat.st_size))
    return [(h, size) for _, h, size in sorted(found)]
