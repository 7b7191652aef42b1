"""What a warp-specialized kernel shares across its warps, read from its SASS: the setmaxnreg register
pool and the named barriers. Pure Python (no DSL): the compile check and the tests feed it SASS text.

Register pool. At launch every warp gets the entry register count (REGCOUNT, allocated in units of 8
per thread), so the CTA's pool holds entry x threads registers. `setmaxnreg.dec` (SASS
`USETMAXREG.DEALLOC`) gives registers back to the pool, `setmaxnreg.inc` (`USETMAXREG.TRY_ALLOC`)
blocks until the pool has them: if producer regs x 128 x producer warpgroups + consumer regs x 128 x
consumer warpgroups exceeds entry x threads, the consumers wait forever. Roles: the DEALLOC value is
the producer's, the (TRY_)ALLOC value the consumers'; the warpgroup counts come from the family's
RegisterSplit (its spec), since the SASS does not say which warps run which branch.

Named barriers. Each `BAR.SYNC / BAR.ARV / BAR.RED id, count` must meet every other use of that id
with the same count (a mismatch hangs or corrupts the barrier), id 0 is the CTA-wide barrier
(`__syncthreads`) only, and every id must be one role of the family's declared inventory. An id held
in a register (the kernel computes it, e.g. one barrier per warpgroup) matches the declared role whose
ids are `computed` and whose count it names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

WARPGROUP = 128
HW_NAMED_BARRIERS = 16  # ids 0..15 per CTA

_SECTION = re.compile(r"^\s*\.section\s+([^,\s]+)", re.M)
_MAXNREG = re.compile(r"\bUSETMAXREG\.(DEALLOC|TRY_ALLOC|ALLOC)(?:\.[A-Z_]+)*\s+(?:U?P\w+\s*,\s*)?(0x[0-9a-f]+)\s*;")
_OPERAND = r"(0x[0-9a-f]+|U?R\d+)"
_BAR = re.compile(r"/\*([0-9a-f]+)\*/[^;\n]*?\bBAR\.(SYNC|ARV|RED)(?:\.[A-Z_]+)*\s+" + _OPERAND
                  + r"(?:\s*,\s*" + _OPERAND + r")?(?:\s*,\s*!?U?P[T\d]+)?\s*;")
_ANY_BAR = re.compile(r"\bBAR\.[A-Z]")  # DEPBAR / MEMBAR do not match (no word boundary before BAR)


@dataclass(frozen=True)
class RegisterSplit:
    """A family's declared setmaxnreg plan for one variant: warpgroups per role and the values asked."""

    producer_warpgroups: int
    consumer_warpgroups: int
    producer_registers: int  # setmaxnreg.dec
    consumer_registers: int  # setmaxnreg.inc

    @property
    def threads(self) -> int:
        return WARPGROUP * (self.producer_warpgroups + self.consumer_warpgroups)


@dataclass(frozen=True)
class BarrierRole:
    """One entry of a family's named-barrier inventory."""

    name: str
    ids: tuple[int, ...]
    threads: int
    computed: bool = False  # the kernel computes the id at run time: the SASS names it in a register


@dataclass(frozen=True)
class BarrierUse:
    offset: int
    op: str  # SYNC | ARV | RED
    barrier: int | str  # immediate id, or the register holding it
    threads: int | str | None  # immediate count, a register, or None (every thread of the CTA)


@dataclass(frozen=True)
class KernelResources:
    """One kernel of a cubin: entry registers and threads (from .nv.info), setmaxnreg and barriers (SASS)."""

    name: str
    entry_registers: int | None
    threads: int | None
    dealloc: tuple[int, ...]  # distinct USETMAXREG.DEALLOC values, sorted
    alloc: tuple[int, ...]  # distinct USETMAXREG.(TRY_)ALLOC values, sorted
    barriers: tuple[BarrierUse, ...]
    unparsed: tuple[str, ...] = ()  # USETMAXREG / BAR lines of a form this reader does not know


def _operand(text: str) -> int | str | None:
    return None if not text else int(text, 16) if text.startswith("0x") else text  # '': operand absent


def kernel_sections(text: str) -> list[tuple[str, str]]:
    """(kernel name, SASS) per .text section; text without sections (a snippet) is one kernel ''."""
    marks = list(_SECTION.finditer(text))
    if not marks:
        return [("", text)]
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [(m.group(1)[len(".text."):], text[m.start():end])
            for m, end in zip(marks, ends) if m.group(1).startswith(".text.")]


def _unparsed(text: str) -> tuple[str, ...]:
    odd = []
    for line in text.splitlines():
        if ("USETMAXREG" in line and not _MAXNREG.search(line)) or (_ANY_BAR.search(line) and not _BAR.search(line)):
            odd.append(line.strip())
    return tuple(odd)


def read_kernel(name: str, text: str, entry_registers: int | None, threads: int | None) -> KernelResources:
    values = {"DEALLOC": set(), "ALLOC": set()}
    for kind, regs in _MAXNREG.findall(text):
        values["DEALLOC" if kind == "DEALLOC" else "ALLOC"].add(int(regs, 16))
    barriers = tuple(BarrierUse(int(off, 16), op, _operand(bar), _operand(count))
                     for off, op, bar, count in _BAR.findall(text))
    return KernelResources(name, entry_registers, threads, tuple(sorted(values["DEALLOC"])),
                           tuple(sorted(values["ALLOC"])), barriers, _unparsed(text))


def read_kernels(text: str, launch: dict[str, tuple[int | None, int | None]] | None = None,
                 registers: int | None = None) -> tuple[KernelResources, ...]:
    """Every kernel of a disassembly; `launch` maps kernel name -> (REGCOUNT, threads) from the cubin,
    `registers` stands in for a kernel it lacks (a snippet)."""
    launch = launch or {}
    return tuple(read_kernel(name, body, *launch.get(name, (registers, None))) for name, body in kernel_sections(text))


def _ceil8(regs: int) -> int:
    return -(-regs // 8) * 8
