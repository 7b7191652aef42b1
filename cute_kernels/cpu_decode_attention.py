"""The CPU backend's paged decode attention: csrc/cpu_decode_attention.c, built with the system C
compiler on first use and called through ctypes (no torch headers, so it builds in about a second).

Same contract as attention_ref.decode_attention_ref, which is its oracle in the tests. Where no C
compiler is found the reason is in `unavailable_reason()` and callers keep the torch reference.
The built library is cached per source, compiler and CPU (it is built with -march=native).
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
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "csrc" / "cpu_decode_attention.c"
# -ffast-math lets the softmax use glibc's vector expf (libmvec). It is given to the compile step
# only: linked with it, GCC adds crtfastmath.o, which would flush denormals for the whole process.
COMPILE_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-std=c11"]
LINK_FLAGS = ["-shared", "-fopenmp", "-lm"]


def cache_dir() -> Path:
    root = os.environ.get("CUTE_SERVE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cute-serve")
    return Path(root) / "cpu"


def _cpu_signature() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return platform.machine() + flags


def _build(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, version, *COMPILE_FLAGS, *LINK_FLAGS,
                                    _cpu_signature()]).encode())
    target = cache_dir() / f"cpu_decode_attention-{key.hexdigest()[:16]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # build aside, then move: no torn file
            obj, built = Path(tmp) / "kernel.o", Path(tmp) / target.name
            for cmd in ([compiler, *COMPILE_FLAGS, "-c", str(SOURCE), "-o", str(obj)],
                        [compiler, str(obj), *LINK_FLAGS, "-o", str(built)]):
                subprocess.run(cmd, check=True, capture_output=True, text=True)
            os.replace(built, target)
    return target


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("CUTE_SERVE_CPU_KERNELS", "1") == "0":
        return None, "disabled by CUTE_SERVE_CPU_KERNELS=0"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler found (set CC)"
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except subprocess.CalledProcessError as exc:
        return None, f"building {SOURCE.name} failed: {exc.stderr.strip()[-500:]}"
    except OSError as exc:
        return None, f"loading the CPU attention library failed: {exc}"
    fn = lib.paged_decode_attention_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
    return lib, None


def unavailable_reason() -> str | None:
    """None when the C kernel is built and loaded; otherwise why not."""
    return _library()[1]


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel takes fp32 CPU tensors and whole GQA groups."""
    return (q.device.type == "cpu" and q.dtype == k_cache.dtype == torch.float32
            and q.shape[1] % k_cache.shape[2] == 0 and unavailable_reason() is None)


@dataclass(frozen=True)
class DecodeTables:
    """Block tables and context lengths as the C kernel reads them (int32, contiguous), checked
    against the cache once: they are the same for every layer of a step."""

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    block_size: int
    num_blocks: int


def prepare_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, k_cache: torch.Tensor) -> DecodeTables:
    """Raises ValueError for lengths or block ids outside the tables / cache (the C code reads raw memory)."""
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    bs, num_blocks = k_cache.shape[1], k_cache.shape[0]
    if lens.numel() and (int(lens.min()) < 1 or int(lens.max()) > tables.shape[1] * bs
                         or int(tables.min()) < 0 or int(tables.max()) >= num_blocks):
        raise ValueError("context lengths or block ids out of range of the block tables / cache")
    return DecodeTables(tables, lens, bs, num_blocks)


def decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         context_lens: torch.Tensor, scale: float, tables: DecodeTables | None = None) -> torch.Tensor:
    """q [B, H, d] over each sequence's first context_lens[b] cached tokens -> [B, H, d] (fp32).

    `tables`: prepare_tables(block_tables, context_lens, k_cache), when the caller already made it."""
    lib, reason = _library()
    if lib is None:
        raise RuntimeError(reason)
    if not supports(q, k_cache) or v_cache.dtype != torch.float32:
        raise ValueError(f"unsupported decode attention inputs: {q.dtype} q {tuple(q.shape)}, "
                         f"{k_cache.dtype} cache {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape):
        raise ValueError("the KV caches must be contiguous and of one shape")
    tables = tables or prepare_tables(block_tables, context_lens, k_cache)
    if (tables.block_size, tables.num_blocks) != (k_cache.shape[1], k_cache.shape[0]):
        raise ValueError("the prepared tables were checked against another cache")
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, heads, d = q.shape
    status = lib.paged_decode_attention_f32(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.block_tables.data_ptr(),
        tables.context_lens.data_ptr(), out.data_ptr(), batch, heads, k_cache.shape[2], d, tables.block_size,
        tables.block_tables.shape[1], scale)
    if status:
        raise RuntimeError("CPU decode attention: " + ("bad sizes" if status == 1 else "out of memory"))
    return out
