"""Compile the C shims and link exported variants into one x86-64 shared library (no DSL needed).

Two flavours of the same library, so a GPU box has a fallback:
- "shared": NEEDED libcudart.so.13, the soname torch cu13x wheels ship (nvidia/cu13/lib); glibc 2.2.5.
- "static": libcudart_static.a linked in; needs only libc (glibc >= 2.34 when built on glibc >= 2.34,
  where libpthread/libdl symbols moved into libc) and, at run time, the driver (libcuda.so.1).
Both hide every symbol except cute_aot_* (version script), so the statically linked cudart and DSL
runtime never interpose on, or get interposed by, torch's libcudart in the same process.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
CUDART_SONAME = "libcudart.so.13"
_EXPORTS = "{ global: cute_aot_*; local: *; };\n"
# What a linked library may need at run time: libc and friends, and the CUDA runtime.
ALLOWED_NEEDED = {"libc.so.6", "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                  "libm.so.6", CUDART_SONAME}


@dataclass(frozen=True)
class CudaToolkit:
    include: Path
    lib: Path  # holds libcudart_static.a and libcudart.so.13

    @property
    def static_cudart(self) -> Path:
        return self.lib / "libcudart_static.a"

    @property
    def shared_cudart(self) -> Path:
        return self.lib / CUDART_SONAME


def _toolkit_candidates() -> list[Path]:
    roots = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    roots = [Path(r) for r in roots if r]
    roots += sorted(Path("/usr/local").glob("cuda-13*"), reverse=True)
    roots += [Path(p) / "nvidia" / "cu13" for p in sys.path if p]  # the nvidia-cuda-runtime 13 wheel
    return roots


def find_cuda_toolkit() -> CudaToolkit | None:
    """CUDA 13 headers + cudart (static and shared), from CUDA_HOME, /usr/local/cuda* or the pip wheel."""
    for root in _toolkit_candidates():
        for lib in (root / "lib64", root / "lib"):
            kit = CudaToolkit(root / "include", lib)
            needed = (kit.include / "cuda_runtime.h", kit.static_cudart, kit.shared_cudart)
            if all(path.is_file() for path in needed):
                return kit
    return None


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) found")
    return cc


def _run(cmd: list[str]) -> None:
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{out.stdout}{out.stderr}")


def _cflags(kit: CudaToolkit) -> list[str]:
    return ["-O2", "-fPIC", "-fvisibility=hidden", "-std=c11", "-Wall", "-Werror", f"-I{kit.include}", f"-I{CSRC}"]


def compile_shim(variant: str, header_dir: Path, out_obj: Path, kit: CudaToolkit,
                 shim: str = "prefill_aot_shim.c") -> Path:
    """The family's shim (a csrc/ file) specialized for one variant (its DSL header force-included)."""
    header = header_dir / f"{variant}.h"
    _run([_cc(), *_cflags(kit), f"-DCUTE_AOT_PREFIX={variant}", "-include", str(header),
          "-c", str(CSRC / shim), "-o", str(out_obj)])
    return out_obj


def compile_common(out_obj: Path, kit: CudaToolkit) -> Path:
    _run([_cc(), *_cflags(kit), "-c", str(CSRC / "aot_common.c"), "-o", str(out_obj)])
    return out_obj


def link_library(objects: list[Path], out_so: Path, dsl_runtime_archive: Path, kit: CudaToolkit,
                 cudart: str) -> Path:
    """Link shims + exported objects + the DSL's static runtime; -z defs: nothing left unresolved."""
    exports = out_so.with_suffix(".map")
    exports.write_text(_EXPORTS)
    if cudart == "static":
        runtime = [str(kit.static_cudart), "-ldl", "-lpthread", "-lrt"]
    elif cudart == "shared":
        runtime = [f"-L{kit.lib}", f"-l:{CUDART_SONAME}"]
    else:
        raise ValueError(f"cudart must be 'static' or 'shared', not {cudart!r}")
    _run([_cc(), "-shared", "-o", str(out_so), *map(str, objects), str(dsl_runtime_archive), *runtime,
          "-Wl,--exclude-libs,ALL", f"-Wl,--version-script={exports}", "-Wl,-z,defs", "-Wl,--gc-sections", "-s"])
    exports.unlink()
    return out_so


@dataclass(frozen=True)
class LibraryInfo:
    path: Path
    bytes: int
    machine: str
    needed: tuple[str, ...]
    undefined: tuple[str, ...]  # dynamic symbols left for the loader, without their @version
    exported: tuple[str, ...]  # every defined dynamic symbol (should be cute_aot_* only)
    max_glibc: str


def _tool(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def _dynamic_symbols(so: Path, which: str) -> tuple[str, ...]:
    lines = _tool("nm", "-D", which, str(so)).splitlines()
    return tuple(sorted({line.split()[-1].split("@")[0] for line in lines if line.strip()}))


def inspect_library(so: Path) -> LibraryInfo:
    """What the loader will need: NEEDED entries, undefined and exported dynamic symbols (binutils)."""
    machine = re.search(r"Machine:\s*(.+)", _tool("readelf", "-h", str(so))).group(1).strip()
    needed = tuple(re.findall(r"\(NEEDED\).*\[(.+?)\]", _tool("readelf", "-d", str(so))))
    undefined, exported = (_dynamic_symbols(so, which) for which in ("--undefined-only", "--defined-only"))
    versions = re.findall(r"GLIBC_(\d+(?:\.\d+)+)", _tool("objdump", "-T", str(so)))
    max_glibc = max(versions, key=lambda v: tuple(map(int, v.split("."))), default="")
    return LibraryInfo(so, so.stat().st_size, machine, needed, undefined, exported, max_glibc)
