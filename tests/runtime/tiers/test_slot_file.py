"""The disk tier's slot file (runtime/tiers/slot_file.py): a full budget reuses the least recently used
block's slot in place, a restart finds the blocks and their LRU order again, a refused slot is cleared,
and a file it cannot read as its own starts afresh."""
import os

from runtime.tiers.block_file import BlockRecord, decode, encode
from runtime.tiers.disk_tier import SLOTS_NAME, DiskTier
from runtime.tiers.slot_file import PAGE, SlotFile, slot_bytes_for

FP = bytes(range(16))
TOKENS = tuple(range(16))


def record(h: int, size: int = 5000) -> bytes:
    return encode(BlockRecord(FP, h, TOKENS, bytes([h % 256]) * size))


def budget_for(slots: int) -> int:
    return PAGE + slots * slot_bytes_for(len(record(0)))


def test_a_full_budget_overwrites_the_least_recently_used_slot(tmp_path):
    tier = DiskTier(str(tmp_path), budget_for(3), FP)
    for h in (1, 2, 3):
        assert tier.write(h, record(h)) == []
    assert tier.read(1) is not None  # 1 used last: 2 is the least recent now
    assert tier.write(4, record(4)) == []
    assert set(tier.index) == {1, 3, 4} and tier.index[4][0] == 1  # block 2's slot, in place
    assert os.path.getsize(tier.dir / SLOTS_NAME) <= budget_for(3)  # the file did not grow
    assert decode(tier.read(4), FP, 4, TOKENS).payload == bytes([4]) * 5000
    tier.close()


def test_a_restart_finds_the_blocks_and_their_order(tmp_path):
    tier = DiskTier(str(tmp_path), budget_for(3), FP)
    for h in (1, 2, 3):
        tier.write(h, record(h))
    tier.read(1)
    tier.close()
    again = DiskTier(str(tmp_path), budget_for(3), FP)
    assert list(again.index) == [2, 3, 1]  # least recent first, as the last run left it
    assert decode(again.read(3), FP, 3, TOKENS).payload == bytes([3]) * 5000
    again.write(5, record(5))  # evicts 2, the least recent
    assert set(again.index) == {3, 1, 5}
    again.close()
    smaller = DiskTier(str(tmp_path), budget_for(2), FP)  # a smaller budget keeps the most recent
    assert list(smaller.index) == [3, 5] and smaller.used <= budget_for(2)  # 3 was read after 1
    smaller.close()


def test_a_dropped_slot_is_cleared_and_reused(tmp_path):
    tier = DiskTier(str(tmp_path), budget_for(3), FP)
    for h in (1, 2):
        tier.write(h, record(h))
    tier.drop(1)  # refused by a load
    tier.close()
    again = DiskTier(str(tmp_path), budget_for(3), FP)
    assert list(again.index) == [2]  # the restart does not find the refused block
    again.write(7, record(7))
    assert again.index[7][0] == 0  # into the freed slot
    again.close()


def test_a_record_of_another_size_or_a_foreign_file_is_not_used(tmp_path):
    tier = DiskTier(str(tmp_path), budget_for(3), FP)
    tier.write(1, record(1))
    other = record(2, size=3 * PAGE)  # not this directory's layout: no slot holds it
    assert tier.write(2, other) == [(2, other)] and not tier.contains(2)
    tier.close()
    path = tier.dir / SLOTS_NAME
    path.write_bytes(b"not a slot file" * 1000)
    assert SlotFile(str(path)).slot_bytes == 0  # unreadable header: the first write starts the file afresh
    again = DiskTier(str(tmp_path), budget_for(3), FP)
    assert len(again) == 0
    again.write(3, record(3))
    assert os.path.getsize(path) <= PAGE + slot_bytes_for(len(record(3)))
    assert decode(again.read(3), FP, 3, TOKENS).payload == bytes([3]) * 5000
    again.close()


def test_slots_written_direct_or_through_the_cache_read_back_the_same(tmp_path, monkeypatch):
    """O_DIRECT where the file system takes it; a refusal (EINVAL) falls back to buffered writes for good."""
    tier = DiskTier(str(tmp_path), budget_for(4), FP)
    direct = tier.file.direct
    assert tier.write(1, record(1)) == [] and decode(tier.read(1), FP, 1, TOKENS).payload == bytes([1]) * 5000
    if direct is None:  # this file system has no O_DIRECT: buffered from the start
        tier.close()
        return
    real = os.pwritev

    def refuse_direct(fd, parts, offset):
        if fd == direct:
            raise OSError(22, "Invalid argument")
        return real(fd, parts, offset)

    monkeypatch.setattr(os, "pwritev", refuse_direct)
    assert tier.write(2, record(2)) == [] and tier.file.direct is None
    assert tier.write(3, record(3)) == []
    for h in (1, 2, 3):
        assert decode(tier.read(h), FP, h, TOKENS).payload == bytes([h]) * 5000
    tier.close()
