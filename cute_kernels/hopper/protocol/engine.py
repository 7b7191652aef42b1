"""The protocol model's machine: one CTA's warps as generators of operations on mbarriers, named
barriers, shared-memory slots and the copy engines, run under a seeded random interleaving in which
every copy in flight lands at a random later step.

Hardware semantics (PTX ISA, sm_90), as modelled:
- mbarrier: init(count) gives phase 0, pending = count, tx = 0. arrive(n) takes n pending arrivals;
  arrive.expect_tx(b) adds b to tx, then arrives; a TMA copy landing does complete_tx(bytes). The
  current phase completes when pending == 0 and tx == 0: the phase bit flips and pending resets.
  try_wait.parity(p) passes iff the phase of parity p has completed, i.e. the current phase's parity
  is not p (one bit: a wait two phases late blocks for ever). An arrival the phase has no room for
  (pending already 0, bytes still due) is undefined behaviour: an error here.
- named barrier (bar.sync / bar.arrive id, count): threads arrive a warp (32) at a time; count
  arrivals complete a generation and release its bar.sync waiters. One count per id.
- TMA load: lands later, in any order; then its slot holds the tag and its barrier gets the bytes.
- cp.async: lands at any time up to the issuing warp's wait_group(0); a generic-proxy write, seen by
  the async proxy (wgmma, TMA store) only after the writer's fence.proxy.async.
- TMA store (cp.async.bulk): reads its slots until it completes (any order); commit_group closes the
  warp's open bulk group; wait_group(n) passes once all but its n most recent groups are complete.
Errors (ProtocolError.kind): deadlock (no warp can move, nothing in flight, a warp unfinished); race (a
slot written while a reader holds it, a copy writes it or a store reads it); stale (a read of a slot
in flight or holding another tag than the reader expects); unfenced (async-proxy read of a generic
write not fenced); barrier (arrival without room, two counts on one id); bounds (an index outside
its buffer or table); exit (copies in flight or expect-tx bytes pending when the CTA exits).
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

ANY = object()  # a read that accepts whatever tag the slot holds (still landed and fenced)
SPEEDS = (1e-4, 0.03, 0.3, 1.0, 3.0)  # relative weights of a kind of copy landing at a step


class ProtocolError(AssertionError):
    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class MBarrier:
    def __init__(self, name: str, count: int):
        self.name, self.count = name, count
        self.pending, self.tx, self.phase, self.completions = count, 0, 0, 0

    def arrive(self, n: int = 1, tx: int = 0) -> None:
        if n > self.pending:
            raise ProtocolError("barrier", f"{n} arrival(s) on {self.name} with {self.pending} pending "
                                f"(tx {self.tx}): more arrivals than its count {self.count}")
        self.tx += tx
        self.pending -= n
        self._settle()

    def complete_tx(self, nbytes: int) -> None:
        self.tx -= nbytes
        self._settle()

    def _settle(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1
            self.completions += 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: the phase of this parity has completed."""
        return self.phase != parity


class NamedBarrier:
    def __init__(self, bid: int):
        self.bid, self.count, self.arrived, self.generation = bid, None, 0, 0

    def arrive(self, threads: int, count: int) -> int:
        """Arrive; returns the generation this arrival belongs to."""
        if self.count is None:
            self.count = count
        if count != self.count or count % 32:
            raise ProtocolError("barrier", f"named barrier {self.bid} used with counts {self.count} and {count}")
        generation = self.generation
        self.arrived += threads
        if self.arrived == count:
            self.generation, self.arrived = generation + 1, 0
        return generation


@dataclass
class Slot:
    """A shared-memory region: the tag of its last completed write and who may touch it now."""

    tag: object = None
    fenced: bool = True  # visible to the async proxy (TMA writes are; generic ones after a fence)
    writer: str | None = None  # the warp whose generic write is not fenced yet
    writing: int = 0  # copies in flight into it
    incoming: object = None  # the tag those copies bring
    storing: int = 0  # TMA stores in flight reading it
    readers: set = field(default_factory=set)
    fills: int = 0


class Machine:
    """State shared by the agents of one CTA, plus the copies in flight."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.bars: dict[str, MBarrier] = {}
        self.named: dict[int, NamedBarrier] = {}
        self.slots: dict[object, Slot] = {}
        self.inflight: list = []  # events with .land(machine)
        self.cp_async: dict[str, list] = {}  # warp -> its cp.async copies in flight
        self.groups: dict[str, list] = {}  # warp -> committed bulk groups (lists of store events)
        self.open_group: dict[str, list] = {}

    def mbarrier(self, name: str, count: int) -> MBarrier:
        self.bars[name] = MBarrier(name, count)
        return self.bars[name]

    def named_barrier(self, bid: int) -> NamedBarrier:
        return self.named.setdefault(bid, NamedBarrier(bid))

    def slot(self, key) -> Slot:
        return self.slots.setdefault(key, Slot())

    def check_writable(self, key, what: str, agent: str) -> Slot:
        s = self.slot(key)
        others = s.readers - {agent}
        if others or s.writing or s.storing:
            holders = f"readers {sorted(others)}" if others else f"{s.writing} copies in / {s.storing} stores out"
            raise ProtocolError("race", f"{agent}: {what} into {key} while {holders}")
        return s

    def check_readable(self, key, expect, agent: str, async_proxy: bool = True) -> Slot:
        s = self.slot(key)
        if s.writing:
            raise ProtocolError("stale", f"{agent}: read of {key} while a copy into it is in flight")
        if s.tag is None or (expect is not ANY and not expect == s.tag):
            raise ProtocolError("stale", f"{agent}: read of {key} holding {s.tag}, expected {expect}")
        if async_proxy and not s.fenced:
            raise ProtocolError("unfenced", f"{agent}: async-proxy read of {key}: {s.writer}'s write not fenced")
        return s


class Op:
    """One step of an agent. ready(): may it run now; run(): do it, maybe returning the op it then
    blocks on (a bar.sync's wait)."""

    def ready(self, m: Machine, agent: str) -> bool:
        return True

    def run(self, m: Machine, agent: str):
        return None


def land_all(m: Machine, events: list) -> None:
    for ev in events:
        if ev in m.inflight:
            m.inflight.remove(ev)
            ev.land(m)


@dataclass
class RunStats:
    steps: int = 0
    fills: dict = field(default_factory=dict)  # slot key -> times written

    def max_fills(self, prefix) -> int:
        """Most fills of a slot whose key starts with prefix (ring wrap-around was exercised if > 1)."""
        return max((n for k, n in self.fills.items() if isinstance(k, tuple) and k[0] == prefix), default=0)


def run(build: Callable[[Machine], dict[str, Iterator[Op]]], seed: int, max_steps: int = 500_000) -> RunStats:
    """Run the agents build(machine) returns under the interleaving of `seed`; ProtocolError on a
    deadlock or any violation. Per run, each agent and each kind of copy (TMA load, cp.async, TMA
    store) get a random speed (weight), so some runs starve the consumers, others the producer, and
    others keep stores or loads in flight for a long time."""
    m = Machine(random.Random(seed))
    agents = build(m)
    weight = {name: m.rng.choice((0.05, 0.3, 1.0)) for name in agents}
    # copy speeds cycle with the seed, so any 5 consecutive seeds give each kind every speed
    kinds = ("_TmaLoadEvent", "_CpAsyncEvent", "_StoreEvent")
    copy_weight = {kind: SPEEDS[(seed + 2 * i) % len(SPEEDS)] for i, kind in enumerate(kinds)}
    pending = {name: next(gen, None) for name, gen in agents.items()}
    steps = 0
    while True:
        blocked = {n: op for n, op in pending.items() if op is not None}
        if not blocked:
            break  # every warp has exited: whatever is still in flight outlives the CTA
        names = [n for n, op in blocked.items() if op.ready(m, n)]
        if not names and not m.inflight:
            raise ProtocolError("deadlock", "; ".join(f"{n} at {op}" for n, op in blocked.items()))
        steps += 1
        if steps > max_steps:
            raise ProtocolError("deadlock", f"no end after {max_steps} steps")
        chosen = _pick(m, names, weight, copy_weight)
        if chosen is None:
            continue  # a copy landed
        follow = pending[chosen].run(m, chosen)
        pending[chosen] = follow if follow is not None else next(agents[chosen], None)
    _check_exit(m)
    return RunStats(steps, {k: s.fills for k, s in m.slots.items()})


def _pick(m: Machine, names: list[str], weight: dict, copy_weight: dict) -> str | None:
    """A weighted random choice among the runnable agents and the copies in flight; a chosen copy lands."""
    event_weights = [copy_weight[type(ev).__name__] for ev in m.inflight]
    pick = m.rng.random() * (sum(weight[n] for n in names) + sum(event_weights))
    for n in names:
        pick -= weight[n]
        if pick < 0:
            return n
    if not m.inflight:
        return names[-1]  # float rounding left pick just above 0
    landing = m.inflight[-1]
    for ev, w in zip(m.inflight, event_weights):
        pick -= w
        if pick < 0:
            landing = ev
            break
    m.inflight.remove(landing)
    landing.land(m)
    return None


def _check_exit(m: Machine) -> None:
    if m.inflight:
        raise ProtocolError("exit", f"the CTA exits with {len(m.inflight)} copies in flight: {m.inflight[:3]}")
    due = [b.name for b in m.bars.values() if b.tx]
    if due:
        raise ProtocolError("exit", f"the CTA exits with expect-tx bytes still due on {due}")
