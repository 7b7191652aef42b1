"""The compile check's rules for what a kernel's warps share (sass_resources.py reads it): the setmaxnreg
register-pool identity and the named-barrier inventory. Each rule returns the problems that fail a
variant in `python -m cute_kernels.check`; the summaries go to its --verbose and --json output."""
from __future__ import annotations

from collections import defaultdict

from .sass_resources import HW_NAMED_BARRIERS, WARPGROUP, BarrierRole, BarrierUse, KernelResources, RegisterSplit
from .sass_resources import _ceil8 as ceil8


def register_pool_problems(k: KernelResources, split: RegisterSplit | None) -> list[str]:
    """Both setmaxnreg roles present, as planned, and the raised consumers fit the CTA's pool."""
    if not (k.dealloc or k.alloc):
        return ["the family declares a setmaxnreg split but the SASS has no USETMAXREG"] if split else []
    if split is None:
        return ["USETMAXREG in a kernel whose family declares no RegisterSplit (roles and warpgroups unknown)"]
    return _role_problems(k, split) or _pool_problems(k, split)


def _role_problems(k: KernelResources, split: RegisterSplit) -> list[str]:
    problems = []
    for kind, values, planned in (("DEALLOC", k.dealloc, split.producer_registers),
                                  ("ALLOC", k.alloc, split.consumer_registers)):
        if not values:
            problems.append(f"USETMAXREG without {kind}: the kernel needs both setmaxnreg.dec and .inc")
        elif len(values) > 1:
            problems.append(f"{len(values)} distinct USETMAXREG.{kind} values {list(values)}: one per role expected")
        elif values[0] != planned:
            problems.append(f"USETMAXREG.{kind} {values[0]} but the kernel's plan says {planned}")
        problems += [f"USETMAXREG.{kind} {v}: setmaxnreg takes a multiple of 8 in 24..256"
                     for v in values if v % 8 or not 24 <= v <= 256]
    return problems


def _pool_problems(k: KernelResources, split: RegisterSplit) -> list[str]:
    if k.entry_registers is None:
        return ["entry register count (REGCOUNT) not read from the cubin: the setmaxnreg pool is unchecked"]
    problems = []
    if k.threads is not None and k.threads != split.threads:
        problems.append(f"the setmaxnreg roles cover {split.threads} threads, the kernel launches {k.threads}")
    pool = pool_summary(k, split)
    producer, consumer, entry = k.dealloc[0], k.alloc[0], pool["entry_registers"]
    if producer > entry:
        problems.append(f"USETMAXREG.DEALLOC {producer} above the entry count {entry} (setmaxnreg.dec must lower)")
    if consumer < entry:
        problems.append(f"USETMAXREG.ALLOC {consumer} below the entry count {entry} (setmaxnreg.inc must raise)")
    if pool["needed"] > pool["available"]:
        problems.append(f"setmaxnreg pool overflow: {pool['text']}: setmaxnreg.inc waits forever")
    return problems


def pool_summary(k: KernelResources, split: RegisterSplit) -> dict:
    """producer regs x 128 x warpgroups + consumer regs x 128 x warpgroups vs entry x threads."""
    threads = k.threads if k.threads is not None else split.threads
    entry = ceil8(k.entry_registers)  # registers are allocated 8 per thread (256 per warp)
    producer, consumer = k.dealloc[0], k.alloc[0]
    pw, cw = split.producer_warpgroups, split.consumer_warpgroups
    needed = WARPGROUP * (producer * pw + consumer * cw)
    text = (f"{producer}x{WARPGROUP}x{pw} + {consumer}x{WARPGROUP}x{cw} = {needed} "
            f"{'<=' if needed <= entry * threads else '>'} {entry}x{threads} = {entry * threads}")
    return dict(producer_registers=producer, producer_warpgroups=pw, consumer_registers=consumer,
                consumer_warpgroups=cw, entry_registers=entry, threads=threads, needed=needed,
                available=entry * threads, text=text)


def inventory_problems(roles: tuple[BarrierRole, ...], cta_threads: int | None) -> list[str]:
    """The declaration itself: each id one role, ids 1..15, counts whole warps within the CTA."""
    problems, owner = [], {}
    for role in roles:
        for i in role.ids:
            if i in owner:
                problems.append(f"barrier id {i} declared for two roles: {owner[i]} and {role.name}")
            owner[i] = role.name
            if not 0 < i < HW_NAMED_BARRIERS:
                problems.append(f"barrier role {role.name}: id {i} outside 1..{HW_NAMED_BARRIERS - 1} (0 is CTA-wide)")
        if role.threads <= 0 or role.threads % 32 or (cta_threads and role.threads > cta_threads):
            problems.append(f"barrier role {role.name}: {role.threads} threads is not whole warps of the CTA")
    return problems


def _role_of(use: BarrierUse, roles: tuple[BarrierRole, ...]) -> list[BarrierRole]:
    """The declared roles a use can be: by id, or for an id in a register by computed id and count."""
    if isinstance(use.barrier, int):
        return [r for r in roles if use.barrier in r.ids]
    return [r for r in roles if r.computed and r.threads == use.threads]


def _use_problem(use: BarrierUse, roles: tuple[BarrierRole, ...], cta_threads: int | None) -> str | None:
    where = f"BAR.{use.op} {use.barrier} at {use.offset:#x}"
    if isinstance(use.threads, str):
        return f"{where}: thread count in a register ({use.threads}), not checkable"
    if use.barrier == 0:
        ok = use.threads in (None, cta_threads)
        return None if ok else f"{where} with {use.threads} threads: id 0 is the CTA-wide barrier only"
    matches = _role_of(use, roles)
    count = cta_threads if use.threads is None else use.threads
    if len(matches) != 1:
        kind = "no" if not matches else "more than one"
        return f"{where} with {count} threads: {kind} declared barrier role matches"
    if matches[0].threads != count:
        return f"{where} with {count} threads: role {matches[0].name} declares {matches[0].threads}"
    return None


def barrier_problems(k: KernelResources, roles: tuple[BarrierRole, ...]) -> list[str]:
    """Every BAR in the SASS: one count per id, id 0 CTA-wide only, each id a declared role, and every
    declared role used (a stale inventory checks nothing)."""
    problems = inventory_problems(roles, k.threads)
    counts = defaultdict(set)
    for use in k.barriers:
        if isinstance(use.barrier, int) and use.barrier:
            counts[use.barrier].add(k.threads if use.threads is None else use.threads)
    problems += [f"barrier id {i} used with {len(c)} thread counts {sorted(c, key=str)}"
                 for i, c in sorted(counts.items()) if len(c) > 1]
    groups: dict[tuple, list[BarrierUse]] = defaultdict(list)  # one verdict per (id, count)
    for use in k.barriers:
        groups[(use.barrier, use.threads)].append(use)
    for uses in groups.values():
        problem = _use_problem(uses[0], roles, k.threads)
        problems += [f"{problem} ({len(uses)} uses)"] if problem else []
    used = {r.name for u in k.barriers for r in _role_of(u, roles)}
    problems += [f"declared barrier role {r.name} (ids {list(r.ids)}, {r.threads} threads) is not in the SASS"
                 for r in roles if r.name not in used]
    return problems


def inventory_rows(k: KernelResources, roles: tuple[BarrierRole, ...]) -> list[dict]:
    """The barriers the SASS uses, one row per (id, role, count): what --verbose and --json print."""
    rows: dict[tuple, dict] = {}
    for use in k.barriers:
        matches = _role_of(use, roles)
        role = "cta" if use.barrier == 0 else matches[0].name if len(matches) == 1 else "?"
        threads = "all" if use.threads is None else use.threads
        bar = use.barrier if isinstance(use.barrier, int) else "reg"  # an id computed at run time
        row = rows.setdefault((str(bar), role, str(threads)), dict(id=bar, role=role, threads=threads, ops=[], uses=0))
        row["uses"] += 1
        if use.op not in row["ops"]:
            row["ops"].append(use.op)
    return sorted(rows.values(), key=lambda r: (isinstance(r["id"], str), str(r["id"])))


def format_inventory(rows: list[dict]) -> str:
    return " ".join(f"{r['id']}:{r['role']}/{r['threads']}({','.join(r['ops']).lower()}x{r['uses']})" for r in rows)


def kernel_problems(k: KernelResources, split: RegisterSplit | None, roles: tuple[BarrierRole, ...]) -> list[str]:
    """Everything this module checks for one kernel, unknown instruction forms included."""
    problems = [f"unparsed {line!r}: the resource reader does not know this form" for line in k.unparsed]
    return problems + register_pool_problems(k, split) + barrier_problems(k, roles)
