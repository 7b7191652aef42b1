"""The CPU backend's varlen prefill attention: csrc/cpu_prefill_attention.c (built by build.py).

Same contract (PrefillArgs) as reference.prefill_attention_ref, which is its oracle in the tests: new query
rows over [paged prefix ; new keys], bottom-right causal alignment. Where the C kernel cannot be
built the reason is in `unavailable_reason()` and callers keep the torch reference.

On CPUs with AMX-BF16, csrc/amx/cpu_prefill_attention_amx.c runs the same contract on the tiles (keys down their
rows: csrc/amx/attention_tiles.h) with Q, K, V and the softmax weights rounded to bf16 (fp32 sums); on CPUs with
AVX-512 BF16 but no AMX, the same roundings on vdpbf16ps. One of them is taken (bf16_kernel) only where the KV cache holds bf16 or 8-bit values, the CPU
default (runtime/device.py): there the keys and values were rounded already, and a float32 cache keeps the
fp32 kernel's precision.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.cpu import build
from cute_kernels.cpu.kv_elem import KV_KINDS, kv_kind, scale_pointers
from cute_kernels.paged_tables import as_int32, check_block_ids

MAX_HEAD_DIM = 256  # the kernel's per-thread scratch (MAX_D)
MAX_GROUP = 64  # query heads per KV head (MV)


BF16_MIN_Q_ROWS = 16  # fewer new rows (a decode-sized chunk) keep the fp32 kernel: the bf16 ones pack every key first
KERNELS = ("fp32", "amx", "bf16")  # the fp32 FMA kernel, the AMX tiles, vdpbf16ps
_ARGS = [ctypes.c_void_p] * 10 + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 2


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_prefill_attention", {"paged_prefill_attention_f32": (_ARGS, ctypes.c_int)})


def _bf16_library() -> tuple[ctypes.CDLL | None, str | None]:
    return build.load_with_signatures("cpu_prefill_attention_amx", {
        "paged_prefill_attention_amx": (_ARGS, ctypes.c_int), "paged_prefill_attention_bf16": (_ARGS, ctypes.c_int),
        "amx_available": ([], ctypes.c_int), "bf16_available": ([], ctypes.c_int)})


@functools.cache  # per route: asks the kernel for the tile state once
def _built(route: str | None, kernel: str) -> bool:
    lib = _bf16_library()[0]
    return lib is not None and (lib.amx_available() if kernel == "amx" else lib.bf16_available()) == 1


def available(kernel: str) -> bool:
    """The kernel is built for this route (and, for AMX, this process may use the tile registers)."""
    if kernel == "fp32":
        return unavailable_reason() is None
    return {"amx": "amx_bf16", "bf16": "avx512_bf16"}[kernel] in build.cpu_flags() and _built(build.active_route(), kernel)


def bf16_kernel(args: PrefillArgs) -> str | None:
    """The bf16 kernel prefill_attention_cpu takes for args' sequences of BF16_MIN_Q_ROWS new rows or more ("amx"
    before "bf16"; the others take the fp32 one), None for all on the fp32 one: it needs a bf16 or 8-bit KV
    cache, head_dim a multiple of 64, GQA groups of at most 32 heads."""
    q, cache = args.q, args.k_cache
    if not (cache is not None and cache.dtype != torch.float32 and cache.dtype in KV_KINDS and q.shape[2] % 64 == 0
            and q.shape[1] // args.k.shape[1] <= 32):
        return None
    return next((kernel for kernel in ("amx", "bf16") if available(kernel)), None)


def unavailable_reason() -> str | None:
    """None when the C kernel is built and loaded; otherwise why not."""
    return _library()[1]


def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """fp32 CPU tensors, whole GQA groups, head_dim a multiple of 16 up to 256."""
    heads, kv_heads, d = q.shape[1], k.shape[1], q.shape[2]
    return (q.device.type == "cpu" and q.dtype == k.dtype == torch.float32 and heads % kv_heads == 0
            and heads // kv_heads <= MAX_GROUP and d % 16 == 0 and d <= MAX_HEAD_DIM and unavailable_reason() is None)


@dataclass(frozen=True)
class PrefillTables:
    """Offsets, prefix lengths and block tables as the C kernel reads them (int32, contiguous),
    checked once: they are the same for every layer of a step."""

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    prefix_lens: torch.Tensor
    block_tables: torch.Tensor
    q_rows: int
    k_rows: int
    cache_shape: tuple[int, int] | None  # (num_blocks, block_size) checked against; None: no prefix read

    # Derived once per step (the engine prepares one PrefillTables for every layer), not once per layer.
    @functools.cached_property
    def short(self) -> tuple[bool, ...]:
        """Per sequence: fewer than BF16_MIN_Q_ROWS new rows, so the fp32 kernel whatever the others take."""
        return tuple((self.cu_q.diff() < BF16_MIN_Q_ROWS).tolist())

    @functools.cached_property
    def halves(self) -> tuple[tuple[torch.Tensor, torch.Tensor, PrefillTables], ...]:
        """subset() of the short sequences, then of the others."""
        return tuple(subset(self, torch.tensor([b for b, short in enumerate(self.short) if short == want]))
                     for want in (True, False))


def prepare_tables(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, prefix_lens: torch.Tensor | None,
                   block_tables: torch.Tensor | None, cache_shape: tuple[int, int] | None) -> PrefillTables:
    """Raises ValueError for offsets, lengths or block ids the C code would read out of bounds.
    cache_shape: (num_blocks, block_size) of the KV caches, None without caches."""
    cu_q, cu_k = as_int32(cu_seqlens_q), as_int32(cu_seqlens_k)
    batch = cu_q.numel() - 1
    prefix = as_int32(prefix_lens) if prefix_lens is not None else torch.zeros(batch, dtype=torch.int32)
    tables = as_int32(block_tables) if block_tables is not None else torch.zeros(batch, 1, dtype=torch.int32)
    if batch < 0 or cu_k.numel() != batch + 1 or prefix.numel() != batch:
        raise ValueError("cu_seqlens must have one entry more than there are sequences")
    q_lens, k_lens = cu_q.diff(), cu_k.diff()
    if (int(cu_q[0]) != 0 or int(cu_k[0]) != 0 or bool((q_lens < 0).any()) or bool((k_lens < 0).any())
            or bool((prefix < 0).any()) or bool((q_lens > prefix + k_lens).any())):
        raise ValueError("cu_seqlens / prefix lengths do not describe the q and k rows")
    checked = None
    if batch and int(prefix.max()) > 0:
        if cache_shape is None or tables.dim() != 2 or tables.shape[0] != batch:
            raise ValueError("a cached prefix needs the KV caches and one block table per sequence")
        checked = (int(cache_shape[0]), int(cache_shape[1]))
        check_block_ids(tables, int(prefix.max()), *checked, "prefix lengths")
    return PrefillTables(cu_q, cu_k, prefix, tables, int(cu_q[-1]), int(cu_k[-1]), checked)


def _rows(cu: torch.Tensor, seqs: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(int(cu[b]), int(cu[b + 1])) for b in seqs])


def _offsets(cu: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int32), cu.diff()[seqs].cumsum(0).to(torch.int32)])


def subset(tables: PrefillTables, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, PrefillTables]:
    """(query row indices, key row indices, tables) of the smaller call made of sequences `seqs` (ascending)."""
    q_rows, k_rows = _rows(tables.cu_q, seqs.tolist()), _rows(tables.cu_k, seqs.tolist())
    sub = PrefillTables(_offsets(tables.cu_q, seqs), _offsets(tables.cu_k, seqs), tables.prefix_lens[seqs].contiguous(),
                        tables.block_tables[seqs].contiguous(), q_rows.numel(), k_rows.numel(), tables.cache_shape)
    return q_rows, k_rows, sub


def prefill_attention_cpu(args: PrefillArgs, kernel: str | None = None) -> torch.Tensor:
    """q [Tq, H, d], k/v [Tk, Hkv, d] (fp32; the paged caches fp32, bf16, or int8 / e4m3 with
    args.kv_scales) -> [Tq, H, d]; see reference.prefill_attention_ref.

    args.plan: the PrefillTables of prepare_tables(cu_seqlens_q, cu_seqlens_k, prefix_lens,
    block_tables, k_cache.shape[:2]), when the caller already made them; else they are made here.
    kernel: one of KERNELS for every sequence, or (None) bf16_kernel's for sequences of BF16_MIN_Q_ROWS new rows
    or more and the fp32 one for the others."""
    q, k, v, k_cache, v_cache = args.q, args.k, args.v, args.k_cache, args.v_cache
    lib, reason = _library()
    if lib is None:
        raise RuntimeError(reason)
    if not supports(q, k) or v.dtype != torch.float32 or v.shape != k.shape:
        raise ValueError(f"unsupported prefill attention inputs: {q.dtype} q {tuple(q.shape)}, "
                         f"{k.dtype} k {tuple(k.shape)}, {v.dtype} v {tuple(v.shape)}")
    has_cache = k_cache is not None and v_cache is not None
    if has_cache and not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape
                          and k_cache.dtype == v_cache.dtype and k_cache.dtype in KV_KINDS
                          and tuple(k_cache.shape[2:]) == tuple(k.shape[1:])):
        raise ValueError("the KV caches must be contiguous fp32, bf16, int8 or e4m3 [blocks, block_size, kv_heads, "
                         "head_dim]")
    k_scale, v_scale = scale_pointers(k_cache, args.kv_scales, k.shape[1]) if has_cache else (None, None)
    tables = args.plan or prepare_tables(args.cu_seqlens_q, args.cu_seqlens_k, args.prefix_lens, args.block_tables,
                                         tuple(k_cache.shape[:2]) if has_cache else None)
    if (tables.q_rows, tables.k_rows) != (q.shape[0], k.shape[0]):
        raise ValueError("cu_seqlens / prefix lengths do not describe the q and k rows")
    if tables.cache_shape is not None and (not has_cache or tables.cache_shape != tuple(k_cache.shape[:2])):
        raise ValueError("the prepared tables were checked against another cache")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if kernel is not None:
        if kernel not in KERNELS:
            raise ValueError(f"unknown prefill attention kernel {kernel!r} (one of {', '.join(KERNELS)})")
        return _launch(lib, kernel, args, q, k, v, tables, k_scale, v_scale)
    bf16 = bf16_kernel(args)  # a sequence's kernel follows its own rows (tables.short), not its company
    if bf16 is None or all(tables.short):
        return _launch(lib, "fp32", args, q, k, v, tables, k_scale, v_scale)
    if not any(tables.short):
        return _launch(lib, bf16, args, q, k, v, tables, k_scale, v_scale)
    out = torch.empty_like(q)
    for name, (q_rows, k_rows, sub) in zip(("fp32", bf16), tables.halves):
        out[q_rows] = _launch(lib, name, args, q[q_rows], k[k_rows], v[k_rows], sub, k_scale, v_scale)
    return out


def _launch(lib: ctypes.CDLL, kernel: str, args: PrefillArgs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            tables: PrefillTables, k_scale, v_scale) -> torch.Tensor:
    """One kernel call on contiguous q, k, v and their checked tables."""
    k_cache, v_cache = args.k_cache, args.v_cache
    has_cache = k_cache is not None and v_cache is not None
    out = torch.empty_like(q)
    k_cache_ptr = k_cache.data_ptr() if has_cache else k.data_ptr()  # unread when no prefix
    v_cache_ptr = v_cache.data_ptr() if has_cache else v.data_ptr()
    block_size = k_cache.shape[1] if has_cache else 1
    if not available(kernel):
        raise RuntimeError(f"the {kernel} prefill attention is not available here")
    run = (lib.paged_prefill_attention_f32 if kernel == "fp32" else
           getattr(_bf16_library()[0], f"paged_prefill_attention_{kernel}"))
    status = run(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), k_cache_ptr, v_cache_ptr, tables.block_tables.data_ptr(),
        tables.cu_q.data_ptr(), tables.cu_k.data_ptr(), tables.prefix_lens.data_ptr(), out.data_ptr(),
        tables.prefix_lens.numel(), q.shape[1], k.shape[1], q.shape[2], block_size, tables.block_tables.shape[1],
        args.scale, int(args.causal), kv_kind(k_cache, v_cache) if has_cache else 0, k_scale, v_scale)
    if status:
        raise RuntimeError("CPU prefill attention: " + {1: "bad sizes", 2: "out of memory"}.get(status, f"no {kernel}"))
    return out
