"""Builds the CPU backend's C kernels (cute_kernels/cpu/csrc/*.c) with the system C compiler on first
use and loads them through ctypes: no torch headers, so a kernel builds in about a second.

A built library is cached per source (and the headers beside it), compiler, flags and CPU (it is
built with -march=native).
Where no compiler is found, or CUTE_SERVE_CPU_KERNELS=0, `load` says why and callers keep the
torch references.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
# -ffast-math lets loops use glibc's vector expf (libmvec). It is given to the compile step only:
# linked with it, GCC adds crtfastmath.o, which would flush denormals for the whole process.
COMPILE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c11"]
LINK_FLAGS = ["-shared", "-fopenmp", "-lm"]


def cache_dir() -> Path:
    root = os.environ.get("CUTE_SERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cute-serve")
    return Path(root) / "cpu"


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            flags = next(line for line in info if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return platform.machine() + flags


@functools.cache
def _compiler_version(compiler: str) -> str:
    """Asked once per process: each ask is a process start (~40 ms), and a warm start loads ~7 kernels."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout


def _build(source: Path, compiler: str, extra_flags: tuple[str, ...] = ()) -> Path:
    version = _compiler_version(compiler)
    compile_flags = [*COMPILE_FLAGS, *extra_flags]
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what a source may #include
    key = hashlib.sha256("\0".join([source.read_text(), *headers, compiler, version, *compile_flags, *LINK_FLAGS,
                                    _cpu_signature()]).encode())
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then move: no torn file
            obj, built = Path(tmp) / "kernel.o", Path(tmp) / target.name
            for cmd in ([compiler, *compile_flags, "-c", str(source), "-o", str(obj)],
                        [compiler, str(obj), *LINK_FLAGS, "-o", str(built)]):
                subprocess.run(cmd, check=True, capture_output=True, text=True)
            os.replace(built, target)
    return target


def load_with_signatures(name: str, signatures: dict[str, tuple[list, object]],
                         extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str | None]:
    """load(name, extra_flags), with each symbol's ctypes (argtypes, restype) set from `signatures`."""
    lib, reason = load(name, extra_flags)
    for symbol, (argtypes, restype) in signatures.items() if lib is not None else ():
        getattr(lib, symbol).argtypes, getattr(lib, symbol).restype = argtypes, restype
    return lib, reason


@functools.cache
def load(name: str, extra_flags: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str | None]:
    """(library, None) for csrc/<name>.c, built if needed; (None, reason) where it cannot be.
    extra_flags (e.g. a -D selecting a portable variant) are added to the compile step."""
    if os.environ.get("CUTE_SERVE_CPU_KERNELS", "1") == "0":
        return None, "disabled by CUTE_SERVE_CPU_KERNELS=0"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler found (set CC)"
    source = CSRC / f"{name}.c"
    try:
        return ctypes.CDLL(str(_build(source, compiler, tuple(extra_flags)))), None
    except subprocess.CalledProcessError as exc:
        return None, f"building {source.name} failed: {exc.stderr.strip()[-500:]}"
    except OSError as exc:
        return None, f"loading {source.name}'s library failed: {exc}"
