"""The TMA-election lint (cute_kernels/toolchain/tma_lint.py): the Hopper kernels pass it, and each shape
of the nested-election hang fails it (the prefill kernel's lane-0 loads as they were, an elect_one
around a load, a load reached through a helper called by one lane, a lane test through a local)."""
from pathlib import Path

import pytest

from cute_kernels.toolchain.tma_lint import HOPPER, lint

LANE_ZERO_LOADS = '''
class Loads:
    def produce(self, q_tma, bars, ptid, tiles_done):
        if ptid == 0:
            cute.arch.mbarrier_wait(bars.q_empty, (tiles_done % 2) ^ 1)
            cute.arch.mbarrier_arrive_and_expect_tx(bars.q_full, self.q_tile_bytes)
            cute.copy(q_tma[0], q_tma[2], q_tma[1], tma_bar_ptr=bars.q_full)
'''
ELECTED_LOAD = '''
def load(atom, src, dst, bar):
    with cute.arch.elect_one():
        cute.copy(atom, src, dst, tma_bar_ptr=bar)
'''
THROUGH_A_HELPER = '''
def issue(atom, src, dst, bar):
    cute.copy(atom, src, dst, tma_bar_ptr=bar)

def kernel(atom, src, dst, bar):
    tidx, _, _ = cute.arch.thread_idx()
    if tidx == 0:
        issue(atom, src, dst, bar)
'''
THROUGH_A_LOCAL = '''
def kernel(atom, src, dst, bar):
    tidx, _, _ = cute.arch.thread_idx()
    first_lane = tidx % 32 == 0
    if first_lane:
        cute.copy(atom, src, dst, tma_bar_ptr=bar)
'''
WHOLE_WARP = '''
def kernel(atom, src, dst, bar, store_atom, s, g):
    tidx, _, _ = cute.arch.thread_idx()
    warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if warp_idx == 0:
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, 1024)
        cute.copy(atom, src, dst, tma_bar_ptr=bar)
    if tidx == 128:
        cute.copy(store_atom, s, g)  # a TMA store: not elected by the DSL, one thread may issue it
'''


def lint_source(tmp_path: Path, source: str) -> list:
    path = tmp_path / "kernel.py"
    path.write_text(source)
    return lint([path])


def test_the_hopper_kernels_pass():
    assert lint(sorted(HOPPER.rglob("*.py"))) == []


@pytest.mark.parametrize("source,where", [(LANE_ZERO_LOADS, "if ptid == 0"), (ELECTED_LOAD, "elect_one"),
                                          (THROUGH_A_HELPER, "if tidx == 0"), (THROUGH_A_LOCAL, "if first_lane")])
def test_each_nested_election_fails(tmp_path, source, where):
    found = lint_source(tmp_path, source)
    assert len(found) == 1 and where in found[0].reason, found


def test_whole_warp_loads_and_one_thread_stores_pass(tmp_path):
    assert lint_source(tmp_path, WHOLE_WARP) == []
