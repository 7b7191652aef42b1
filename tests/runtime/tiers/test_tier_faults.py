"""What can go wrong below the pool, each a logged miss (the block recomputed, the same tokens) or a clear
start-up error, never a wrong token or a stuck request: corrupted, truncated or foreign block files, a
full disk, a slow disk, a request aborted while its blocks load, a second server, an unusable path."""
import errno
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import runtime.tiers.connector as connector_module
from runtime.engine_stats import EngineStats
from runtime.errors import UserError
from runtime.sampling_params import SamplingParams
from runtime.tiers.block_file import HEADER, BlockRecord, CorruptBlock, decode, encode
from runtime.tiers.block_io import BlockIO
from runtime.tiers.connector import TieredConnector
from runtime.tiers.disk_tier import SLOTS_NAME, DiskTier
from runtime.tiers.slot_file import SlotFile
from tests.runtime.tiers.tier_workload import PROMPTS, baseline, engine, run_rounds
from tests.tiny_engine import tiny_engine


@pytest.fixture(scope="module")
def want():
    return baseline()


def written(tmp_path) -> Path:
    """The slot file a round of the workload left behind."""
    with engine(kv_disk_path=str(tmp_path)) as e:
        run_rounds(e, rounds=1)
    return next(tmp_path.glob(f"*/{SLOTS_NAME}"))


def test_flipped_slots_are_recomputed(tmp_path, want, caplog):
    path = written(tmp_path)
    file = SlotFile(str(path))
    found = file.scan()
    for f in found:  # a byte of each block's payload
        at = file.record_offset(f.slot) + f.record_bytes - 100
        os.pwrite(file.fd, bytes([os.pread(file.fd, 1, at)[0] ^ 0xFF]), at)
    file.close()
    with caplog.at_level(logging.WARNING, "cute_serve"), engine(kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]
        assert e.stats.tiers["corrupt_blocks"] >= len(PROMPTS) and not e.stats.tiers.get("disk_hits")
    assert "checksum" in caplog.text
    file, fp, bad = SlotFile(str(path)), bytes.fromhex(path.parent.name), 0
    for f in file.scan():  # a refused slot is cleared (or holds a recomputed block now): a restart skips it
        data = file.read(f.slot, f.record_bytes)
        try:
            decode(data, fp, f.block_hash, record_tokens(data))
        except CorruptBlock:
            bad += 1  # a block behind a refused one in its prefix: never asked for
    file.close()
    assert bad <= len(found) - e.stats.tiers["corrupt_blocks"]


def record_tokens(data: bytearray) -> tuple[int, ...]:
    return tuple(np.frombuffer(data, "<i8", count=16, offset=HEADER.size).tolist())


def test_a_cut_slot_file_is_refused_as_truncated(tmp_path, want):
    path = written(tmp_path)
    file = SlotFile(str(path))
    end = max(file.record_offset(f.slot) + f.record_bytes for f in file.scan())
    file.close()
    os.truncate(path, end - 7)  # the last slot's record loses its tail (a slot may end in padding)
    fp = bytes.fromhex(path.parent.name)
    tier = DiskTier(str(tmp_path), 1 << 30, fp)
    last = max(tier.index.items(), key=lambda kv: kv[1][0])[0]
    data = tier.read(last)
    with pytest.raises(CorruptBlock, match="truncated"):
        decode(data, fp, last, record_tokens(data))
    tier.close()
    with engine(kv_disk_path=str(tmp_path)) as e:  # the engine serves on: the cut block is recomputed
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]


def test_a_block_file_of_another_model_is_refused(tmp_path):
    mine = written(tmp_path)
    with tiny_engine(num_blocks=24, seed=1) as other:  # other weights: same tokens, same hashes, other KV
        want = run_rounds(other, rounds=1)
    with tiny_engine(num_blocks=24, seed=1, kv_disk_path=str(tmp_path)) as other:
        theirs = other.scheduler.connector.tiers[0].dir
    shutil.copy(mine, theirs / SLOTS_NAME)  # planted where the other model looks for its own blocks
    with tiny_engine(num_blocks=24, seed=1, kv_disk_path=str(tmp_path)) as other:
        assert len(other.scheduler.connector.tiers[0]) > 0
        assert run_rounds(other, rounds=1) == want
        assert other.stats.tiers["corrupt_blocks"] > 0 and not other.stats.tiers.get("disk_hits")


def test_a_full_disk_costs_blocks_not_requests(tmp_path, want, monkeypatch, caplog):
    def full(fd, parts, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    with caplog.at_level(logging.WARNING, "cute_serve"), engine(kv_disk_path=str(tmp_path)) as e:
        monkeypatch.setattr(os, "pwritev", full)  # from here on every block write fails
        assert run_rounds(e) == want
        assert e.stats.tiers["write_failures"] > 0 and not e.stats.tiers.get("disk_hits")
    assert caplog.text.count("ENOSPC") == 1  # logged once, not per block


def test_a_slow_disk_times_out_into_recomputing(tmp_path, want, monkeypatch):
    written(tmp_path)
    read = DiskTier.read
    monkeypatch.setattr(DiskTier, "read", lambda self, h: time.sleep(0.15) or read(self, h))
    monkeypatch.setattr(connector_module, "LOAD_TIMEOUT_S", 0.05)
    with engine(kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]
        tiers = e.stats.tiers  # one timeout, then no load waits on the hung disk for a while
        assert tiers["load_timeouts"] == 1 and tiers["lookups_paused"] >= len(PROMPTS) - 2
        assert e.pool.num_free == e.pool.num_blocks


class GatedTier:
    """A tier whose reads wait until the test lets each block through."""
    name, inline, checksummed = "gated", False, True  # its reads wait: never loaded inline

    def __init__(self, blocks: dict[int, bytes]) -> None:
        self.blocks, self.gates = blocks, {h: threading.Event() for h in blocks}

    def contains(self, h: int) -> bool:
        return h in self.blocks

    def read(self, h: int) -> bytearray:
        self.gates[h].wait(10)
        return bytearray(self.blocks[h])

    def drain(self) -> list:
        return []

    def close(self) -> None:
        pass


def test_a_load_abandoned_earlier_never_answers_for_the_next(monkeypatch):
    kv = [(torch.zeros(4, 16, 1, 8), torch.zeros(4, 16, 1, 8))]
    io, fp, tokens = BlockIO(kv), bytes(16), tuple(range(16))
    payload = bytes(range(256)) * (io.block_bytes // 256)
    tier = GatedTier({h: encode(BlockRecord(fp, h, tokens, payload)) for h in (1, 2)})
    c = TieredConnector(io, fp, [tier], EngineStats())
    monkeypatch.setattr(connector_module, "PAUSE_AFTER_TIMEOUT_S", 0.0)
    c.load("seq", [(1, 1, tokens)])
    monkeypatch.setattr(connector_module, "LOAD_TIMEOUT_S", 0.0)
    assert c.finished() == [("seq", 0)]  # abandoned: the scheduler recomputes, later loads again
    monkeypatch.setattr(connector_module, "LOAD_TIMEOUT_S", 60.0)
    c.load("seq", [(2, 2, tokens)])
    tier.gates[1].set()  # the first load's read returns at last
    time.sleep(0.2)
    assert c.finished() == []  # it must not end the second, still filling block 2
    tier.gates[2].set()
    assert c.finished(wait=5) == [("seq", 1)]
    assert bytes(kv[0][0][2].reshape(-1).view(torch.uint8)) == payload[:io.block_bytes // 2]
    assert not kv[0][0][1].any()  # the abandoned load wrote nothing
    c.close([])


def test_stray_files_in_the_directory_are_left_alone(tmp_path, want):
    fp_dir = written(tmp_path).parent
    (fp_dir / "notes.kvb").write_text("mine")
    (fp_dir / "README").write_text("mine")
    with engine(kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)] and e.stats.tiers["disk_hits"] > 0
    assert (fp_dir / "notes.kvb").read_text() == "mine"


def test_aborting_a_request_whose_blocks_are_loading_frees_them(tmp_path, want, monkeypatch):
    written(tmp_path)
    read = DiskTier.read
    monkeypatch.setattr(DiskTier, "read", lambda self, h: time.sleep(0.05) or read(self, h))
    with engine(kv_disk_path=str(tmp_path)) as e:
        e.add_request("gone", PROMPTS[0], SamplingParams(temperature=0, max_tokens=4))
        e.step()
        assert e.scheduler.loading  # waiting aside for its blocks
        e.abort_request("gone")
        while e.has_unfinished_requests() or e.scheduler.loading:
            e.step()
        assert e.pool.num_free == e.pool.num_blocks
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]


def test_two_servers_on_one_directory_and_unusable_paths_are_start_up_errors(tmp_path):
    with engine(kv_disk_path=str(tmp_path)):
        with pytest.raises(UserError, match="another server uses it"):
            engine(kv_disk_path=str(tmp_path))
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("")
    with pytest.raises(UserError, match="cannot write"):
        engine(kv_disk_path=str(a_file))


def test_blocks_held_for_a_load_never_starve_a_growing_request(tmp_path, monkeypatch):
    long = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)  # grows to 9 of the 10 blocks
    with tiny_engine(num_blocks=10) as e:
        want = run_one(e, list(range(3, 19)), long)
    written(tmp_path)
    gate, read = threading.Event(), DiskTier.read
    monkeypatch.setattr(DiskTier, "read", lambda self, h: gate.wait(30) and read(self, h))
    with tiny_engine(num_blocks=10, kv_disk_path=str(tmp_path)) as e:
        e.add_request("long", list(range(3, 19)), long)
        for _ in range(40):  # 4 blocks so far
            e.step()
        e.add_request("loads", PROMPTS[0], SamplingParams(temperature=0, max_tokens=2))  # its load holds 5
        outs = {}
        while e.has_unfinished_requests():
            outs.update({o.request_id: o for o in e.step() if o.finished})
            if "long" in outs or e.stats.preemptions:  # it could not grow: now the load may land
                gate.set()
        assert outs["long"].outputs[0].token_ids == want and outs["long"].outputs[0].finish_reason == "length"
        assert e.pool.num_free == e.pool.num_blocks


def run_one(e, prompt: list[int], params: SamplingParams) -> list[int]:
    e.add_request("r", prompt, params)
    while True:
        for o in e.step():
            if o.finished:
                return o.outputs[0].token_ids
