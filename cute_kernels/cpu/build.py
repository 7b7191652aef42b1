"""Builds the CPU backend's C kernels (cute_kernels/cpu/csrc/*.c) with the system C compiler on first
use and loads them through ctypes: no torch headers, so a kernel builds in about a second.

A built library is cached per source (and the headers beside it), compiler, flags and CPU (it is
built with -march=native).
Where no compiler is found, or CUTE_SERVE_CPU_KERNELS=0, `load` says why and callers keep the
torch references.

Routes (csrc/isa.h): every library is built for one SIMD route, by default the best this CPU runs.
`using_route` (or CUTE_SERVE_CPU_ROUTE) builds the others on the same machine: AVX2 with the AVX-512
features turned off, and the plain C that non-x86 machines compile, so one x86 test run covers the code
an AVX2, an AVX-512 and an ARM machine take. CUTE_SERVE_CPU_SANITIZE=1 builds with ASan + UBSan
(the process must preload their runtimes: see tests/cute_kernels/cpu/test_cpu_sanitizers.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
SOURCE_DIRS = (CSRC, CSRC / "amx", CSRC / "tiles")  # amx/: the kernels on the AMX tiles; tiles/: the int8 tiles GEMM; their sources #include csrc's headers
# -ffast-math lets loops use glibc's vector expf (libmvec). It is given to the compile step only:
# linked with it, GCC adds crtfastmath.o, which would flush denormals for the whole process.
COMPILE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c11"]
LINK_FLAGS = ["-shared", "-fopenmp", "-lm"]
# The sanitizer build: no fast-math, so no finite-math assumption hides what UBSan would see; -O1, the
# level ASan documents (the instrumented kernels took 81 s to build at -O3 on 2 cores, 33 s at -O1).
SANITIZE_COMPILE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
                    "-fno-fast-math", "-g", "-O1")
SANITIZE_LINK = ("-fsanitize=address,undefined",)


@dataclass(frozen=True)
class Route:
    """One SIMD route of the C kernels: the flags that select it and the CPU features it needs."""
    name: str  # as csrc/isa.h's cpu_isa_name() reports it
    flags: tuple[str, ...]
    needs: frozenset[str]  # /proc/cpuinfo flags


ROUTES = {r.name: r for r in (
    Route("avx512-vnni", (), frozenset({"avx512f", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"})),
    Route("avx2", ("-mno-avx512f", "-mno-avxvnni"), frozenset({"avx2", "fma", "f16c"})),
    Route("portable-c", ("-DCPU_PORTABLE",), frozenset()),
)}
_active_route: list[str | None] = [os.environ.get("CUTE_SERVE_CPU_ROUTE") or None]  # None: -march=native
_loaded: dict[str, str] = {}  # library name -> the route of its last load


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as info:
            return frozenset(next(line for line in info if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return frozenset()


def route_unavailable(name: str) -> str | None:
    """Why this machine cannot run route `name` (None when it can)."""
    if name not in ROUTES:
        return f"unknown CPU kernel route {name!r} (known: {', '.join(ROUTES)})"
    if ROUTES[name].needs and platform.machine() not in ("x86_64", "AMD64"):
        return f"{name} is an x86 route; this is {platform.machine()}"
    missing = sorted(ROUTES[name].needs - cpu_flags())
    return f"this CPU lacks {', '.join(missing)}" if missing else None


def active_route() -> str | None:
    """The route libraries load for now (None: the best this CPU runs)."""
    return _active_route[0]


@contextlib.contextmanager
def using_route(name: str | None) -> Iterator[None]:
    """Libraries loaded inside are built for route `name` (None: the best this CPU runs)."""
    if name is not None and (reason := route_unavailable(name)):
        raise ValueError(reason)
    saved, _active_route[0] = _active_route[0], name
    try:
        yield
    finally:
        _active_route[0] = saved


_SANITIZED = os.environ.get("CUTE_SERVE_CPU_SANITIZE", "0") == "1"  # read once: load() runs on every kernel call


def cache_dir() -> Path:
    root = os.environ.get("CUTE_SERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cute-serve")
    return Path(root) / "cpu"


def _cpu_signature() -> str:
    return platform.machine() + (" ".join(sorted(cpu_flags())) or platform.processor())


@functools.cache
def _compiler_version(compiler: str) -> str:
    """Asked once per process: each ask is a process start (~40 ms), and a warm start loads ~7 kernels."""
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout


def _build(source: Path, compiler: str, extra_flags: tuple[str, ...] = (), link_flags: tuple[str, ...] = ()) -> Path:
    version = _compiler_version(compiler)
    compile_flags, link = [*COMPILE_FLAGS, f"-I{CSRC}", *extra_flags], [*LINK_FLAGS, *link_flags]
    dirs = dict.fromkeys((source.parent, *SOURCE_DIRS))  # what a source may #include
    headers = [h.read_text() for d in dirs for h in sorted(d.glob("*.h"))]
    key = hashlib.sha256("\0".join([source.read_text(), *headers, compiler, version, *compile_flags, *link,
                                    _cpu_signature()]).encode())
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then move: no torn file
            obj, built = Path(tmp) / "kernel.o", Path(tmp) / target.name
            for cmd in ([compiler, *compile_flags, "-c", str(source), "-o", str(obj)],
                        [compiler, str(obj), *link, "-o", str(built)]):
                subprocess.run(cmd, check=True, capture_output=True, text=True)
            os.replace(built, target)
    return target


def load_with_signatures(name: str, signatures: dict[str, tuple[list, object]]) -> tuple[ctypes.CDLL | None, str | None]:
    """load(name), with each symbol's ctypes (argtypes, restype) set from `signatures` on first load."""
    lib, reason = load(name)
    if lib is not None and not getattr(lib, "_cute_signed", False):
        for symbol, (argtypes, restype) in signatures.items():
            getattr(lib, symbol).argtypes, getattr(lib, symbol).restype = argtypes, restype
        lib._cute_signed = True
    return lib, reason


def _route_flags(route: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(compile, link) flags beyond the defaults for a route (None: -march=native) in this process."""
    flags = () if route is None else ROUTES[route].flags
    return ((*flags, *SANITIZE_COMPILE), SANITIZE_LINK) if _SANITIZED else (flags, ())


def load(name: str) -> tuple[ctypes.CDLL | None, str | None]:
    """(library, None) for csrc/<name>.c built for the active route, built if needed; (None, reason) where
    it cannot be."""
    route = _active_route[0]
    if route is not None and (reason := route_unavailable(route)):
        return None, reason
    return _load(name, *_route_flags(route))


def prebuild(routes: list[str | None], jobs: int | None = None) -> None:
    """Builds every library for each route into the cache, `jobs` compiles at a time (each a process of
    its own), so the loads that follow find them built; a failed build is left for its load to report."""
    compiler = _compiler()
    if compiler is None:
        return
    sources = [p for d in SOURCE_DIRS for p in sorted(d.glob("*.c"))]
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        for done in [pool.submit(_build, src, compiler, *_route_flags(r)) for r in routes for src in sources]:
            with contextlib.suppress(subprocess.CalledProcessError):
                done.result()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def loaded_routes() -> dict[str, str]:
    """Library name -> the route it was built for, for each library this process has loaded (for /metrics)."""
    return dict(_loaded)


@functools.cache  # a library's route never changes; choose_path asks on every linear call
def isa(lib: ctypes.CDLL) -> str:
    """The route a loaded library was built for (csrc/isa.h): avx512-vnni, avx2 or portable-c."""
    lib.cpu_kernel_isa.restype = ctypes.c_char_p
    return lib.cpu_kernel_isa().decode()


@functools.cache
def _load(name: str, extra_flags: tuple[str, ...], link_flags: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("CUTE_SERVE_CPU_KERNELS", "1") == "0":
        return None, "disabled by CUTE_SERVE_CPU_KERNELS=0"
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found (set CC)"
    source = next((d / f"{name}.c" for d in SOURCE_DIRS if (d / f"{name}.c").exists()), CSRC / f"{name}.c")
    try:
        lib = ctypes.CDLL(str(_build(source, compiler, extra_flags, link_flags)))
    except subprocess.CalledProcessError as exc:
        return None, f"building {source.name} failed: {exc.stderr.strip()[-500:]}"
    except OSError as exc:
        return None, f"loading {source.name}'s library failed: {exc}"
    _loaded[name] = isa(lib)
    return lib, None
