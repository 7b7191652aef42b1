"""KV tiers below the pool (runtime/tiers/): evicted prefix blocks come back from host memory or disk
with greedy outputs identical to recomputing them, across a restart too; refused settings are one-line
errors before any model loads."""
import os
import sys
import threading

import numpy as np
import pytest

from app.block_map import BELOW_COLOR, render
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.kv.block_pool import ALSO_BELOW
from runtime.tiers.attach import wants_tiers
from runtime.tiers.disk_tier import SLOTS_NAME
from tests.runtime.tiers.tier_workload import PROMPTS, baseline, engine, run_rounds


@pytest.fixture(scope="module")
def want():
    return baseline()


def test_disk_hits_give_the_tokens_recomputing_gives(tmp_path, want):
    with engine(kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e) == want
        tiers = e.stats.tiers
        assert tiers["disk_hits"] >= 5 * len(PROMPTS) // 2 and tiers["disk_written_bytes"] > 0
        assert e.pool.num_free == e.pool.num_blocks and not e.scheduler.loading
        assert "disk" in e.ledger.describe()


def test_a_restarted_engine_starts_warm(tmp_path, want):
    with engine(kv_disk_path=str(tmp_path)) as e:
        run_rounds(e, rounds=1)
    with engine(kv_disk_path=str(tmp_path)) as e:  # closing wrote the cached blocks out
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]
        assert e.stats.tiers["disk_hits"] >= 5 * len(PROMPTS) - 6  # every prefix block but a few
        assert e.stats.computed_prefill_tokens < 2 * 16 * len(PROMPTS)


def test_the_host_tier_spills_to_disk(tmp_path, want):
    block = 2 * 2 * 16 * 2 * 16 * 4  # 2 layers x (K, V) x 16 tokens x 2 heads x 16 dims x 4 bytes
    with engine(kv_offload_bytes=3 * (block + 256), kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e) == want
        assert e.stats.tiers["host_hits"] > 0 and e.stats.tiers["disk_hits"] > 0
        assert 0 < e.snapshot().tiers["host_used_bytes"] <= 3 * (block + 256) == e.snapshot().tiers["host_capacity_bytes"]


def test_host_memory_loads_on_the_cpu_are_copied_at_once(want):
    with engine(kv_offload_bytes=1 << 30) as e:
        assert run_rounds(e) == want
        assert e.stats.tiers["inline_loads"] == e.stats.tiers["loads"] > 0 and not e.scheduler.loading


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_writer_thread_yields_the_cores_to_the_step(tmp_path, want):
    with engine(kv_disk_path=str(tmp_path)) as e:
        assert run_rounds(e) == want  # the writer has started and written
        writer = e.scheduler.connector._writer
        if hasattr(os, "SCHED_IDLE"):  # Linux: the idle class, the step thread's untouched
            assert os.sched_getscheduler(writer.native_id) == os.SCHED_IDLE
            assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_OTHER
        else:
            assert os.getpriority(os.PRIO_PROCESS, writer.native_id) == 19
            assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19


def test_a_restart_keeps_what_host_memory_held(tmp_path, want):
    with engine(kv_offload_bytes=1 << 30, kv_disk_path=str(tmp_path)) as e:  # the host tier holds it all
        run_rounds(e, rounds=1)
    with engine(kv_disk_path=str(tmp_path)) as e:  # closing moved host memory's blocks to the disk
        assert run_rounds(e, rounds=1) == want[:len(PROMPTS)]
        assert e.stats.tiers["disk_hits"] >= 5 * len(PROMPTS) - 6


def test_the_disk_budget_holds(tmp_path, want):
    with engine(kv_disk_path=str(tmp_path), kv_disk_bytes=8 * 10_000) as e:
        assert run_rounds(e) == want
        tier = e.scheduler.connector.tiers[0]
        assert 0 < tier.used <= 8 * 10_000 and (tier.dir / SLOTS_NAME).stat().st_size <= 8 * 10_000
        assert {f.block_hash for f in tier.file.scan()} == set(tier.index)  # evicted blocks' slots reused


@pytest.mark.parametrize("settings", [dict(enable_prefix_caching=False), dict(scheduler="static"),
                                      dict(tensor_parallel_size=2)])
def test_settings_tiers_cannot_run_with_are_refused_before_loading(settings):
    with pytest.raises(UserError, match="kv-disk-path"):
        wants_tiers(EngineConfig(kv_disk_path="/tmp/x", **settings))
    assert not wants_tiers(EngineConfig())


def test_the_block_map_marks_the_blocks_also_held_below(tmp_path):
    with engine(kv_disk_path=str(tmp_path)) as e:
        run_rounds(e)  # the second round loaded its prefixes back: cached in the pool and on disk
        states = e.snapshot(with_block_states=True).block_states
        dotted = np.nonzero(states & ALSO_BELOW)[0]
        assert len(dotted) >= 5 and all(e.scheduler.connector.holds(e.pool.block_hash[b]) for b in dotted)
        assert set(states[dotted] & ~np.uint8(ALSO_BELOW)) <= {1, 2, 3}  # a free block holds nothing to mark
    img = render(states, columns=8, cell=6)
    middle = img[3::6, 3::6].reshape(-1, 3)[: len(states)]  # each cell's centre pixel
    assert {b for b in range(len(states)) if tuple(middle[b]) == BELOW_COLOR} == set(dotted)
    with engine() as e:  # no tiers: nothing marked
        run_rounds(e, rounds=1)
        assert not (e.snapshot(with_block_states=True).block_states & ALSO_BELOW).any()
