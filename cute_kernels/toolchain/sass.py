"""Read what ptxas made of a kernel: disassemble a cubin and count the instructions the design relies on.

nvdisasm comes from the PyPI wheel `nvidia-cuda-nvdisasm`; registers per thread are read from the
cubin's `.nv.info` EIATTR_REGCOUNT records and threads per CTA from EIATTR_REQNTID (no CUDA driver
needed); each kernel's setmaxnreg values and named barriers are read by sass_resources.py.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .sass_resources import KernelResources, read_kernels

# Instruction families we report: tensor-core MMA, async copies, local-memory traffic (spills).
_PATTERNS = {
    "hgmma": r"\bHGMMA\.",  # warpgroup MMA, 16-bit inputs
    "qgmma": r"\bQGMMA\.",  # warpgroup MMA, fp8 inputs
    "hmma": r"\bHMMA\.",  # warp-level MMA (the slow path on Hopper)
    "tma_load": r"\bUTMALDG\b",
    "cp_async": r"\bLDGSTS\b",
    "local_load": r"\bLDL\b",
    "local_store": r"\bSTL\b",
    "setmaxnreg": r"\bUSETMAXREG\b",  # warp-specialized register reallocation
    "tma_store": r"\bUTMASTG\b",
    "bulk_copy": r"\bUBLKCP\b",  # cp.async.bulk (non-tensor)
    "global_load_128": r"\bLDG\.E(?:\.[A-Z0-9_]+)*\.128\b",  # 16-byte vector loads
    "global_store_128": r"\bSTG\.E(?:\.[A-Z0-9_]+)*\.128\b",
    "global_16bit": r"\b(?:LDG|STG)\.E(?:\.[A-Z0-9_]+)*\.(?:U16|S16)\b",  # one 16-bit element at a time
    "mbarrier_waits": r"\bSYNCS\.PHASECHK\b",  # waits on mbarrier phases (async pipelines)
    # a warp-collective op (elect.sync) on a path ptxas could not prove converged: its fallback waits for
    # every lane, which hangs when it sits in a lane-divergent branch (a TMA load under `if tidx == 0`)
    "collective_fallbacks": r"\bWARPSYNC\.COLLECTIVE\b",
    "fsel": r"\bFSEL\b",  # float selects: what an attention mask lowers to (bf16; fp16 gets SEL)
    "fp8_unpack": r"\bF2FP\.F16\.E4M3\.UNPACK_B\b",  # two e4m3 -> two fp16 (dequantizing an fp8 cache)
    "fp8_pack": r"\bF2FP\.SATFINITE\.E4M3\.F32\.PACK_AB(?:_MERGE_C)?\b",  # two fp32 -> two e4m3, saturated (quantizing)
    "shared_load_128": r"\bLDS\.128\b",
    "shared_store_128": r"\bSTS\.128\b",
}
_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH_TARGET = re.compile(r"\bBRA\b[^`]*`\((\.L_x_\d+)\)")
# BAR.SYNC over the whole CTA: barrier 0 with no thread count (named barriers name a count).
_CTA_BARRIER = re.compile(r"/\*([0-9a-f]+)\*/\s+BAR\.SYNC(?:\.DEFER_BLOCKING)?\s+0x0\s*;")
_FIRST_TMA = re.compile(r"/\*([0-9a-f]+)\*/[^\n]*\bUTMALDG\b")
# The last wgmma of a group whose A operand sits in registers (O += P V), and the waits for groups.
_RS_WGMMA_LAST = re.compile(r"\bHGMMA\.\S+ R\d+, R\d+, gdesc\[[^]]*\][^;]*\bgsb0\b")
_WGMMA_WAIT = re.compile(r"\bWARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)")


@dataclass(frozen=True)
class SassStats:
    hgmma: int
    qgmma: int
    hmma: int
    tma_load: int
    cp_async: int
    local_load: int
    local_store: int
    registers: int | None  # per thread, of the largest kernel in the cubin
    hgmma_shapes: tuple[str, ...]  # e.g. ("64x128x16.F32",)
    stack_bytes: int = 0  # largest frame / stack size a kernel in the cubin declares
    setmaxnreg: int = 0
    tma_store: int = 0
    bulk_copy: int = 0
    global_load_128: int = 0
    global_store_128: int = 0
    global_16bit: int = 0
    mbarrier_waits: int = 0
    collective_fallbacks: int = 0
    cta_barrier_offsets: tuple[int, ...] = ()  # byte offsets of CTA-wide BAR.SYNCs
    first_tma_offset: int | None = None  # byte offset of the first UTMALDG
    fsel: int = 0
    fp8_unpack: int = 0
    fp8_pack: int = 0
    shared_load_128: int = 0
    shared_store_128: int = 0
    loop_cta_barriers: int = 0  # CTA-wide BAR.SYNCs inside a loop (between its head and back branch)
    overlapped_exp2: int = 0  # MUFU.EX2 between a register-A wgmma group left in flight and its wait
    exp2_after_overlapped: int = 0  # MUFU.EX2 from such a group's issue to the next wgmma issue
    kernels: tuple[KernelResources, ...] = ()  # per kernel: setmaxnreg, named barriers (sass_resources.py)

    @property
    def spills(self) -> int:
        return self.local_load + self.local_store


def find_nvdisasm() -> str | None:
    """nvdisasm from PATH or from the nvidia-cuda-nvdisasm wheel."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for site in map(Path, sys.path):
        for sub in ("nvidia/cu13/bin/nvdisasm", "nvidia/cuda_nvdisasm/bin/nvdisasm", "nvidia/cu12/bin/nvdisasm"):
            if (site / sub).is_file():
                return str(site / sub)
    return None


def disassemble(cubin: bytes) -> str:
    tool = find_nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: pip install nvidia-cuda-nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], check=True, capture_output=True, text=True).stdout


def _elf_sections(cubin: bytes) -> dict[str, tuple[int, int]]:
    """Section name -> (offset, size) of a 64-bit little-endian ELF."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]
    sections = {}
    for h in headers:
        name = cubin[names_off + h[0]:cubin.index(b"\0", names_off + h[0])].decode()
        sections[name] = (h[4], h[5])
    return sections


_EIATTR_REGCOUNT = 0x2F
_EIATTR_STACK = (0x11, 0x12, 0x23)  # FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE
_EIATTR_REQNTID = 0x10  # per kernel: the block size the PTX's .reqntid fixed (x, y, z)
_EIFMT_SIZED = 4  # u16 length prefix; formats 1-3 (none, byte, half) take 4 bytes in all (seen: sm_90 cubins)


def _nv_info_records(cubin: bytes):
    """(section name, attribute id, payload) of every sized `.nv.info*` record of a 64-bit ELF."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        return
    for name, (off, size) in _elf_sections(cubin).items():
        if not name.startswith(".nv.info"):
            continue
        pos = off
        while pos + 4 <= off + size and cubin[pos] in (1, 2, 3, _EIFMT_SIZED):
            fmt, attr = cubin[pos], cubin[pos + 1]
            length = struct.unpack_from("<H", cubin, pos + 2)[0] if fmt == _EIFMT_SIZED else 0
            if fmt == _EIFMT_SIZED:
                yield name, attr, cubin[pos + 4:pos + 4 + length]
            pos += 4 + length


def _nv_info_max(cubin: bytes, attrs: tuple[int, ...]) -> int | None:
    """Max over kernels of the (symbol, value) `.nv.info` records with one of these attribute ids."""
    values = [struct.unpack_from("<II", payload)[1] for _, attr, payload in _nv_info_records(cubin)
              if attr in attrs and len(payload) == 8]
    return max(values, default=None)


def _symbol_names(cubin: bytes) -> list[str]:
    """.symtab entry index -> name (the REGCOUNT records name their kernel by symbol index)."""
    sections = _elf_sections(cubin)
    if ".symtab" not in sections or ".strtab" not in sections:
        return []
    (sym_off, sym_size), (str_off, _) = sections[".symtab"], sections[".strtab"]
    names = []
    for pos in range(sym_off, sym_off + sym_size, 24):  # Elf64_Sym
        start = str_off + struct.unpack_from("<I", cubin, pos)[0]
        names.append(cubin[start:cubin.index(b"\0", start)].decode())
    return names


def cubin_launch_info(cubin: bytes) -> dict[str, tuple[int | None, int | None]]:
    """Kernel name -> (entry registers per thread from REGCOUNT, threads per CTA from REQNTID)."""
    names, regs, threads = _symbol_names(cubin), {}, {}
    for section, attr, payload in _nv_info_records(cubin):
        if attr == _EIATTR_REGCOUNT and len(payload) == 8 and section == ".nv.info":
            sym, value = struct.unpack_from("<II", payload)
            regs[names[sym] if sym < len(names) else str(sym)] = value
        elif attr == _EIATTR_REQNTID and len(payload) == 12 and section.startswith(".nv.info."):
            x, y, z = struct.unpack_from("<III", payload)
            threads[section[len(".nv.info."):]] = x * y * z
    return {name: (regs.get(name), threads.get(name)) for name in {*regs, *threads}}


def cubin_registers(cubin: bytes) -> int | None:
    """Registers per thread (max over kernels), from the EIATTR_REGCOUNT records of `.nv.info`."""
    return _nv_info_max(cubin, (_EIATTR_REGCOUNT,))


def cubin_stack_bytes(cubin: bytes) -> int:
    """Bytes of per-thread stack frame any kernel declares (0: none)."""
    return _nv_info_max(cubin, _EIATTR_STACK) or 0


def loop_cta_barriers(text: str) -> int:
    """CTA-wide barriers inside loops: a loop is a backward branch, from its BRA back to its target
    label; each barrier is counted once however many loops hold it."""
    labels, instructions, pending = {}, [], []
    for line in text.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        address = _ADDRESS.search(line)
        if address:
            addr = int(address.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            instructions.append((addr, line))
    loops = [(labels[m.group(1)], addr) for addr, line in instructions
             for m in [_BRANCH_TARGET.search(line)] if m and labels.get(m.group(1), addr + 1) <= addr]
    return sum(1 for addr, line in instructions
               if _CTA_BARRIER.search(line) and any(head <= addr <= back for head, back in loops))


def rs_wgmma_overlap(text: str) -> tuple[int, int]:
    """For each register-A wgmma group (O += P V) still in flight at the next wait (wait_group(1)):
    the MUFU.EX2 that run before the wait for all groups (overlapped with it), and all the MUFU.EX2
    from its issue to the next wgmma issue (WARPGROUP.ARRIVE). Summed over such groups."""
    lines = text.splitlines()
    overlapped = total = 0
    for i, line in enumerate(lines):
        if not _RS_WGMMA_LAST.search(line):
            continue
        waits = ((j, w.group(1)) for j in range(i + 1, len(lines)) for w in [_WGMMA_WAIT.search(lines[j])] if w)
        first_wait = next(waits, None)
        if first_wait is None or first_wait[1] == "0":
            continue  # waited for at once: nothing could overlap it
        wait_all = next((j for j, level in waits if level == "0"), len(lines))
        next_issue = next((j for j in range(i + 1, len(lines)) if "WARPGROUP.ARRIVE" in lines[j]), len(lines))
        overlapped += sum("MUFU.EX2" in x for x in lines[i:min(wait_all, next_issue)])
        total += sum("MUFU.EX2" in x for x in lines[i:next_issue])
    return overlapped, total


def stats_from_sass(text: str, registers: int | None = None, stack_bytes: int = 0,
                    launch: dict[str, tuple[int | None, int | None]] | None = None) -> SassStats:
    counts = {key: len(re.findall(pat, text)) for key, pat in _PATTERNS.items()}
    shapes = tuple(sorted(set(re.findall(r"\b[HQ]GMMA\.(\d+x\d+x\d+\.[A-Z0-9]+)", text))))
    first_tma = _FIRST_TMA.search(text)
    overlapped_exp2, exp2_after_overlapped = rs_wgmma_overlap(text)
    return SassStats(**counts, registers=registers, hgmma_shapes=shapes, stack_bytes=stack_bytes,
                     cta_barrier_offsets=tuple(int(m, 16) for m in _CTA_BARRIER.findall(text)),
                     first_tma_offset=int(first_tma.group(1), 16) if first_tma else None,
                     loop_cta_barriers=loop_cta_barriers(text), overlapped_exp2=overlapped_exp2,
                     exp2_after_overlapped=exp2_after_overlapped, kernels=read_kernels(text, launch, registers))


def sass_stats(cubin: bytes) -> SassStats:
    return stats_from_sass(disassemble(cubin), cubin_registers(cubin), cubin_stack_bytes(cubin),
                           cubin_launch_info(cubin))
