"""The CPU backend's paged decode attention: csrc/cpu_decode_attention.c (built by build.py).

Same contract (DecodeArgs) as reference.decode_attention_ref, which is its oracle in the tests. Where
the C kernel cannot be built the reason is in `unavailable_reason()` and callers keep the reference.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.cpu import build
from cute_kernels.cpu.kv_elem import KV_KINDS, kv_kind, scale_pointers
from cute_kernels.kv_quant import KVScales
from cute_kernels.paged_tables import as_int32, check_block_ids


def _library() -> tuple[ctypes.CDLL | None, str | None]:
    args = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_int] + [ctypes.c_void_p] * 2
    return build.load_with_signatures("cpu_decode_attention", {
        "paged_decode_attention_f32": (args, ctypes.c_int),
        "store_kv_rows": ([ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_int, ctypes.c_void_p], None)})


def unavailable_reason() -> str | None:
    """None when the C kernel is built and loaded; otherwise why not."""
    return _library()[1]


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """The kernel takes fp32 CPU queries, an fp32, bf16, int8 or e4m3 cache and whole GQA groups."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype in KV_KINDS
            and q.shape[1] % k_cache.shape[2] == 0 and unavailable_reason() is None)


@dataclass(frozen=True)
class DecodeTables:
    """Block tables and context lengths as the C kernel reads them (int32, contiguous), checked
    against the cache once: they are the same for every layer of a step."""

    block_tables: torch.Tensor
    context_lens: torch.Tensor
    block_size: int
    num_blocks: int


def prepare_tables(block_tables: torch.Tensor, context_lens: torch.Tensor, num_blocks: int,
                   block_size: int) -> DecodeTables:
    """Raises ValueError for lengths or block ids outside the tables / a cache of num_blocks blocks of
    block_size tokens (the C code reads raw memory)."""
    tables, lens = as_int32(block_tables), as_int32(context_lens)
    if lens.numel():
        if int(lens.min()) < 1:
            raise ValueError("context lengths out of range of the block tables / cache")
        check_block_ids(tables, int(lens.max()), num_blocks, block_size, "context lengths")
    return DecodeTables(tables, lens, block_size, num_blocks)


def store_rows(x: torch.Tensor, dtype: torch.dtype, scales: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, heads, d] (fp32) stored by the C code that writes the fused decode step's K/V rows: rounded
    to bf16, or quantized to int8 / e4m3 with scales [heads]."""
    lib, reason = _library()
    if lib is None:
        raise RuntimeError(reason)
    x = x.contiguous().float()
    out = torch.empty(x.shape, dtype=dtype)
    rows, heads, d = x.shape
    ptrs = scale_pointers(out, KVScales(scales, scales) if scales is not None else None, heads)
    lib.store_kv_rows(x.data_ptr(), out.data_ptr(), rows, heads, d, kv_kind(out), ptrs[0])
    return out


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to bf16 by the C code that stores the fused decode step's K/V rows."""
    return store_rows(x.reshape(1, 1, -1), torch.bfloat16).view(x.shape)


def decode_attention_cpu(args: DecodeArgs) -> torch.Tensor:
    """q [B, H, d] over each sequence's first context_lens[b] cached tokens -> [B, H, d] (fp32; the
    cache fp32, bf16, or int8 / e4m3 with args.kv_scales).

    args.plan: the DecodeTables of prepare_tables(block_tables, context_lens, *k_cache.shape[:2]),
    when the caller already made them; else they are made here."""
    q, k_cache, v_cache = args.q, args.k_cache, args.v_cache
    lib, reason = _library()
    if lib is None:
        raise RuntimeError(reason)
    if not supports(q, k_cache) or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"unsupported decode attention inputs: {q.dtype} q {tuple(q.shape)}, "
                         f"{k_cache.dtype} cache {tuple(k_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and v_cache.shape == k_cache.shape):
        raise ValueError("the KV caches must be contiguous and of one shape")
    k_scale, v_scale = scale_pointers(k_cache, args.kv_scales, k_cache.shape[2])
    tables = args.plan or prepare_tables(args.block_tables, args.context_lens, k_cache.shape[0], k_cache.shape[1])
    if (tables.block_size, tables.num_blocks) != (k_cache.shape[1], k_cache.shape[0]):
        raise ValueError("the prepared tables were checked against another cache")
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, heads, d = q.shape
    status = lib.paged_decode_attention_f32(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.block_tables.data_ptr(),
        tables.context_lens.data_ptr(), out.data_ptr(), batch, heads, k_cache.shape[2], d, tables.block_size,
        tables.block_tables.shape[1], args.scale, kv_kind(k_cache, v_cache), k_scale, v_scale)
    if status:
        raise RuntimeError("CPU decode attention: " + ("bad sizes" if status == 1 else "out of memory"))
    return out
