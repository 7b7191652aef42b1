"""The operations a modelled warp yields (engine.py runs them), one per hardware primitive the
kernels use: mbarrier wait / arrive, named barrier sync / arrive, TMA load, cp.async and its wait,
proxy fence, plain shared-memory write, wgmma read (Read ... Release), TMA store and its groups."""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine import MBarrier, Op, ProtocolError, land_all

WARP = 32


@dataclass
class Wait(Op):
    """mbarrier.try_wait.parity(bar, parity) in a loop."""

    bar: MBarrier
    parity: int

    def ready(self, m, agent):
        return self.bar.passed(self.parity)

    def __repr__(self):
        return f"wait({self.bar.name}, parity {self.parity}; phase bit {self.bar.phase}, pending {self.bar.pending})"


@dataclass
class Arrive(Op):
    """mbarrier.arrive (n arrivals: a warp of threads that each arrive), with expect-tx bytes."""

    bar: MBarrier
    n: int = 1
    tx: int = 0

    def run(self, m, agent):
        self.bar.arrive(self.n, self.tx)


@dataclass
class _AwaitGeneration(Op):
    bid: int
    generation: int

    def ready(self, m, agent):
        return m.named[self.bid].generation > self.generation

    def __repr__(self):
        return f"bar.sync({self.bid}) generation {self.generation}"


@dataclass
class NamedSync(Op):
    bid: int
    count: int

    def run(self, m, agent):
        return _AwaitGeneration(self.bid, m.named_barrier(self.bid).arrive(WARP, self.count))


@dataclass
class NamedArrive(Op):
    bid: int
    count: int

    def run(self, m, agent):
        m.named_barrier(self.bid).arrive(WARP, self.count)


@dataclass(eq=False)
class _TmaLoadEvent:
    bar: MBarrier
    keys: list
    tag: object
    nbytes: int

    def land(self, m):
        for key in self.keys:
            s = m.slot(key)
            s.writing -= 1
            if not s.writing:
                s.tag, s.fenced, s.writer = self.tag, True, None
        self.bar.complete_tx(self.nbytes)

    def __repr__(self):
        return f"TMA {self.tag} -> {self.keys}"


def _start_write(m, key, tag, what, agent):
    """Copies of one fill (the same tag: a tile's boxes, its warps' gathers) may overlap; any other
    write while one is in flight, a reader holds the slot or a store reads it, is a race."""
    s = m.slot(key)
    if not (s.writing and s.incoming == tag):
        m.check_writable(key, what, agent)
        s.fills += 1
    elif s.readers - {agent} or s.storing:
        m.check_writable(key, what, agent)
    s.writing += 1
    s.incoming = tag
    s.tag = None  # being overwritten: nothing valid to read until every copy of the fill lands


@dataclass
class TmaLoad(Op):
    """A TMA tensor load (one box) into one slot or several (the parts a box spans), completing
    nbytes on bar when it lands."""

    bar: MBarrier
    key: object
    tag: object
    nbytes: int

    def run(self, m, agent):
        keys = self.key if isinstance(self.key, list) else [self.key]
        for key in keys:
            _start_write(m, key, self.tag, f"TMA load {self.tag}", agent)
        m.inflight.append(_TmaLoadEvent(self.bar, keys, self.tag, self.nbytes))


@dataclass(eq=False)
class _CpAsyncEvent:
    agent: str
    key: object
    tag: object

    def land(self, m):
        s = m.slot(self.key)
        s.writing -= 1
        if not s.writing:
            s.tag, s.fenced, s.writer = self.tag, False, self.agent
        m.cp_async[self.agent].remove(self)

    def __repr__(self):
        return f"cp.async {self.tag} -> {self.key} by {self.agent}"


@dataclass
class CpAsync(Op):
    key: object
    tag: object

    def run(self, m, agent):
        _start_write(m, self.key, self.tag, f"cp.async {self.tag}", agent)
        ev = _CpAsyncEvent(agent, self.key, self.tag)
        m.inflight.append(ev)
        m.cp_async.setdefault(agent, []).append(ev)


class CpAsyncWait(Op):
    """cp.async.commit_group + wait_group(0): this warp's copies have landed."""

    def run(self, m, agent):
        land_all(m, list(m.cp_async.get(agent, [])))


class Fence(Op):
    """fence.proxy.async (fence_view_async_shared): this warp's generic writes, seen by the async proxy."""

    def run(self, m, agent):
        for s in m.slots.values():
            if s.writer == agent and not s.writing:
                s.fenced, s.writer = True, None


@dataclass
class Write(Op):
    """A plain st.shared by this warp (generic proxy). requires: (key, tag) pairs that must have
    landed first (zeroing rows of a stage its copy has not filled yet would be undone by the copy)."""

    key: object
    tag: object
    requires: list = field(default_factory=list)

    def run(self, m, agent):
        for key, expect in self.requires:
            m.check_readable(key, expect, agent, async_proxy=False)
        s = m.check_writable(self.key, f"store {self.tag}", agent)
        s.tag, s.fenced, s.writer = self.tag, False, agent
        s.fills += 1


@dataclass
class Read(Op):
    """An async-proxy read (wgmma operand) of slots, held until the matching Release: each key must
    hold the expected tag (engine.ANY: any landed tag)."""

    reads: list  # (key, expected tag)

    def run(self, m, agent):
        for key, expect in self.reads:
            m.check_readable(key, expect, agent).readers.add(agent)


@dataclass
class Release(Op):
    """This warp's reads of the keys are done (its wgmma completed: wait_group)."""

    keys: list

    def run(self, m, agent):
        for key in self.keys:
            m.slot(key).readers.discard(agent)


@dataclass(eq=False)
class _StoreEvent:
    keys: list

    def land(self, m):
        for key in self.keys:
            m.slot(key).storing -= 1

    def __repr__(self):
        return f"TMA store of {self.keys}"


@dataclass
class BulkStore(Op):
    """cp.async.bulk.tensor shared -> global: reads the slots (all must hold the tag) until done."""

    reads: list  # (key, expected tag)

    def run(self, m, agent):
        for key, expect in self.reads:
            m.check_readable(key, expect, agent).storing += 1
        ev = _StoreEvent([key for key, _ in self.reads])
        m.inflight.append(ev)
        m.open_group.setdefault(agent, []).append(ev)


class BulkCommit(Op):
    def run(self, m, agent):
        m.groups.setdefault(agent, []).append(m.open_group.pop(agent, []))


@dataclass
class BulkWait(Op):
    """cp.async.bulk.wait_group.read n: all but the n most recent committed groups have read smem."""

    n: int

    def ready(self, m, agent):
        groups = m.groups.get(agent, [])
        older = groups[:len(groups) - self.n] if self.n else groups
        return not any(ev in m.inflight for g in older for ev in g)

    def __repr__(self):
        return f"bulk wait_group({self.n})"


def check_index(value: int, limit: int, what: str) -> int:
    """An index the kernel computes must fall inside its buffer (or table row)."""
    if not 0 <= value < limit:
        raise ProtocolError("bounds", f"{what} {value} outside [0, {limit})")
    return value
