"""The disk tier: KV blocks in one file of fixed-size slots under <path>/<fingerprint>/ (slot_file.py),
least recently used first out of a byte budget, kept across runs (a restarted server with the same model
and settings starts warm: it reads the slots' headers back).

A lock file keeps a second server off the same directory (a clear start-up error); a full disk or a
vanished permission costs the block (logged, counted), never the request."""
from __future__ import annotations

import errno
import fcntl
import logging
import threading
from collections import OrderedDict
from pathlib import Path

from runtime.errors import UserError
from runtime.tiers.slot_file import PAGE, SlotFile, slot_bytes_for

log = logging.getLogger("cute_serve")
SLOTS_NAME = "blocks.slots"


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
        except OSError as exc:
            raise UserError(f"--kv-disk-path {root}: cannot write {self.dir} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise UserError(f"--kv-disk-path {root}: another server uses it for this model and settings; stop it "
                            "or give this one a path of its own") from None
        try:
            self.file = SlotFile(str(self.dir / SLOTS_NAME))
        except OSError as exc:
            self._lock.close()
            raise UserError(f"--kv-disk-path {root}: cannot write {self.dir} ({exc.strerror or exc})") from None
        self.guard = threading.Lock()  # the index: the writer and loader threads share it
        self.index: OrderedDict[int, tuple[int, int]] = OrderedDict()  # hash -> (slot, record bytes), LRU first
        self.free: list[int] = []  # slots below `self.slots` that hold nothing
        self.slots = 0  # slots the file has handed out so far
        self.uses = 0  # the last use's counter, persisted in the slot headers
        found = sorted(self.file.scan(), key=lambda f: f.last_use)
        for f in found[-self.capacity():] if self.capacity() else []:  # a smaller budget keeps the most recent
            self.index[f.block_hash] = (f.slot, f.record_bytes)
        self.slots = max((f.slot + 1 for f in found), default=0)
        self.free = sorted(set(range(min(self.slots, self.capacity()))) - {s for s, _ in self.index.values()},
                           reverse=True)
        self.uses = max((f.last_use for f in found), default=0)
        self.failed: set[int] = set()  # errno of write failures already logged

    def capacity(self) -> int:
        """Slots the budget holds (0 until the first block sizes them)."""
        return max(0, (self.budget - PAGE) // self.file.slot_bytes) if self.file.slot_bytes else 0

    @property
    def used(self) -> int:
        return len(self.index) * self.file.slot_bytes

    def __len__(self) -> int:
        return len(self.index)

    def contains(self, block_hash: int) -> bool:
        return block_hash in self.index

    def read(self, block_hash: int) -> bytearray | None:
        with self.guard:
            if (where := self.index.get(block_hash)) is None:
                return None
            self.index.move_to_end(block_hash)  # most recent: never the next slot a write takes
            self.uses += 1
            use = self.uses
        try:
            data = self.file.read(*where)
            self.file.touch(where[0], use, where[1])  # the LRU order survives a restart
        except OSError:
            self.drop(block_hash)
            return None
        return data

    def write(self, block_hash: int, data: bytes) -> list[tuple[int, bytes]]:
        """Store a block in a slot (the writer thread); the block back where the disk would not take it (what
        the budget evicts is overwritten: nothing lies below the disk)."""
        if block_hash in self.index:
            return []
        try:
            if not self.file.slot_bytes:
                self.file.start(len(data))
            slot = self._take_slot(len(data))
            if slot is None:
                return [(block_hash, data)]
            with self.guard:
                self.uses += 1
                use = self.uses
            self.file.write(slot, use, data)
        except OSError as exc:
            if exc.errno not in self.failed:
                self.failed.add(exc.errno)
                log.warning("KV disk tier: writing %s failed (%s); blocks that do not fit are recomputed",
                            self.dir, errno.errorcode.get(exc.errno, exc))
            return [(block_hash, data)]
        with self.guard:
            self.index[block_hash] = (slot, len(data))
        return []

    def _take_slot(self, record_bytes: int) -> int | None:
        """A free slot, a new one while the budget allows, else the least recently used block's; None for a
        record that no slot holds (another size than the file's: not this layout)."""
        if slot_bytes_for(record_bytes) != self.file.slot_bytes or not self.capacity():
            return None
        with self.guard:
            if len(self.index) < self.capacity():
                if self.free:
                    return self.free.pop()
                if self.slots < self.capacity():
                    self.slots += 1
                    return self.slots - 1
            _, (slot, _) = self.index.popitem(last=False)  # full (or a budget cut since the last run)
            return slot

    def drop(self, block_hash: int) -> None:
        """Forget a block (its slot is corrupt or unreadable) and free its slot."""
        with self.guard:
            where = self.index.pop(block_hash, None)
            if where is None:
                return
            self.free.append(where[0])
        try:
            self.file.clear(where[0])
        except OSError:
            pass  # a restart finds it again and refuses it again

    def drain(self) -> list[tuple[int, bytes]]:
        return []  # the disk outlives the process: nothing to hand down at shutdown

    def close(self) -> None:
        """Let another server have the directory (the lock goes with the file)."""
        self.file.close()
        self._lock.close()

    def describe(self) -> str:
        return f"disk {self.budget / 2**30:.1f} GiB at {self.dir.parent} ({len(self.index)} blocks kept)"
