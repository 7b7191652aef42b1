"""Host-side argument preparation for the prefill kernel (pure torch; testable on the CPU).

Turns a PrefillArgs record (the contract of reference.prefill_attention_ref) into exactly what the
kernel reads: int32 metadata, a PrefillSpec (the compile key), max_seqlen_q for the grid, and
placeholders when there is no paged prefix (prefix_lens = 0 means the cache is never read), and the
persistent grid's longest-first tile list (prefill_tile_order.py; cached in the step's plan).
The kernel reads cache blocks through raw addresses, so every block id it may follow is checked
against the cache first (ValueError, never an illegal address): once per step by plan_prefill
(the runtime's backend.plan), or here per call when no plan is given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from cute_kernels.attention_args import PrefillArgs, check_queries_see_keys
from cute_kernels.kv_quant import checked_scales
from cute_kernels.paged_tables import as_int32, check_block_ids

from .prefill_spec import FP8_KV, KV_BLOCK_SIZE, PrefillSpec
from .prefill_tile_order import longest_first_tiles, persistent_ctas

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class PrefillLaunchArgs:
    spec: PrefillSpec
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    prefix_lens: torch.Tensor  # int32 [B]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor  # int32 [B + 1]
    out: torch.Tensor  # like q
    lse: torch.Tensor  # fp32 [total_q, H]
    tile_order: torch.Tensor  # int32 [tiles]: linear tile ids, longest first
    softmax_scale_log2: float
    max_seqlen_q: int
    num_ctas: int  # persistent grid
    k_scale: torch.Tensor  # fp32 [kv_heads]: an e4m3 prefix's scales; a 16-bit variant never reads them
    v_scale: torch.Tensor

    def kernel_tensors(self) -> tuple[torch.Tensor, ...]:
        """Tensors in the argument order of PrefillAttentionSm90.__call__."""
        return (self.q, self.k, self.v, self.k_cache, self.v_cache, self.block_tables, self.prefix_lens,
                self.cu_seqlens_q, self.cu_seqlens_k, self.out, self.lse, self.tile_order, self.k_scale, self.v_scale)


@dataclass(frozen=True)
class PrefillPlan:
    """A step's paged-prefix metadata as the kernel reads it (int32, contiguous), its block ids checked
    against a cache of num_blocks blocks: the same for every layer, so checked once per step."""

    prefix_lens: torch.Tensor | None
    block_tables: torch.Tensor | None
    num_blocks: int
    lengths_checked: bool = False  # every query of the step sees a key (check_queries_see_keys ran)
    # longest-first tile lists of this step, per (tile shape, group, causal, kv_heads, max_seqlen_q)
    tile_orders: dict = field(default_factory=dict, compare=False)


def plan_prefill(prefix_lens: torch.Tensor | None, block_tables: torch.Tensor | None, num_blocks: int,
                 cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None) -> PrefillPlan:
    """Check that every prefix fits its block-table row and every block id is in [0, num_blocks), and
    (given the cu_seqlens) that every query sees a key; ValueError otherwise. Reads the tables on the
    host: one device sync per step, not per layer."""
    checked = cu_seqlens_q is not None and cu_seqlens_k is not None
    if checked:
        check_queries_see_keys(cu_seqlens_q, cu_seqlens_k, prefix_lens)
    if prefix_lens is not None:
        if block_tables is None or block_tables.dim() != 2 or block_tables.shape[0] != prefix_lens.numel():
            raise ValueError("prefill attention: prefix_lens needs one block-table row per sequence")
        if prefix_lens.numel() and int(prefix_lens.max()) > 0:
            if int(prefix_lens.min()) < 0:
                raise ValueError("prefill attention: negative prefix length")
            check_block_ids(block_tables, int(prefix_lens.max()), num_blocks, KV_BLOCK_SIZE,
                            "prefill attention: prefix lengths")
        prefix_lens, block_tables = as_int32(prefix_lens), as_int32(block_tables)
    return PrefillPlan(prefix_lens, block_tables, num_blocks, checked)


def _compact_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _rows_ready(x: torch.Tensor, name: str) -> torch.Tensor:
    """The kernels are compiled for compact row-major layouts (the JIT path's DLPack view rejects
    others) and copy 16-byte row chunks: copy anything else, e.g. a v split off a fused qkv."""
    if x.stride() != _compact_strides(x.shape) or x.data_ptr() % 16:
        x = torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)
    if x.data_ptr() % 16:
        raise ValueError(f"prefill attention: {name} must be 16-byte aligned")
    return x


def _spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, fp8_prefix: bool = False) -> PrefillSpec:
    """The compile key of these inputs; ValueError for inputs no variant takes."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"prefill attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         "expected packed [tokens, heads, head_dim] with k and v alike")
    if q.dtype not in _DTYPE_NAMES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"prefill attention: dtypes {q.dtype}/{k.dtype}/{v.dtype}; need bf16 or fp16, all equal")
    heads, head_dim, kv_heads = q.shape[1], q.shape[2], k.shape[1]
    if k.shape[2] != head_dim or heads % kv_heads:
        raise ValueError(f"prefill attention: {heads} query heads over {kv_heads} KV heads, "
                         f"head_dim {head_dim} vs {k.shape[2]}")
    return PrefillSpec(_DTYPE_NAMES[q.dtype], head_dim, heads // kv_heads, causal, FP8_KV if fp8_prefix else None)


def _fp8_prefix(args: PrefillArgs) -> bool:
    """Whether the kernel reads an e4m3 paged prefix (without a prefix the cache is never read)."""
    return args.prefix_lens is not None and args.k_cache is not None and args.k_cache.dtype == torch.float8_e4m3fn


def _scales(args: PrefillArgs, spec: PrefillSpec, placeholder: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 prefix's fp32 [kv_heads] scales, checked; otherwise `placeholder` (never read)."""
    if not spec.fp8_kv:
        return placeholder, placeholder
    return checked_scales(args.kv_scales, args.k.shape[1], args.q.device, "prefill attention")


def _paged_prefix(args: PrefillArgs, batch: int) -> tuple[torch.Tensor, ...]:
    """(k_cache, v_cache, block_tables, prefix_lens) as the kernel reads them: checked, or tiny
    placeholders without a prefix (prefix 0 means the cache is never read; the signature stays fixed)."""
    q, kv_heads, head_dim = args.q, args.k.shape[1], args.q.shape[2]
    if args.prefix_lens is None:
        placeholder = torch.zeros(1, KV_BLOCK_SIZE, kv_heads, head_dim, dtype=q.dtype, device=q.device)
        return (placeholder, placeholder, torch.zeros(batch, 1, dtype=torch.int32, device=q.device),
                torch.zeros(batch, dtype=torch.int32, device=q.device))
    k_cache, v_cache, block_tables = args.k_cache, args.v_cache, args.block_tables
    if k_cache is None or v_cache is None or block_tables is None:
        raise ValueError("prefill attention: prefix_lens needs k_cache, v_cache and block_tables")
    expected = (KV_BLOCK_SIZE, kv_heads, head_dim)
    cache_dtype = k_cache.dtype if k_cache.dtype == torch.float8_e4m3fn else q.dtype
    if (tuple(k_cache.shape[1:]) != expected or v_cache.shape != k_cache.shape or k_cache.dtype != cache_dtype
            or v_cache.dtype != cache_dtype):
        raise ValueError(f"prefill attention: caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} "
                         f"{k_cache.dtype}/{v_cache.dtype}, expected [num_blocks, {', '.join(map(str, expected))}] "
                         f"{q.dtype} or float8_e4m3fn")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"prefill attention: block_tables {tuple(block_tables.shape)}, expected [{batch}, max_blocks]")
    plan = args.plan if isinstance(args.plan, PrefillPlan) else None
    if plan is None or plan.num_blocks != k_cache.shape[0] or plan.block_tables is None:
        plan = plan_prefill(args.prefix_lens, block_tables, k_cache.shape[0])
    return k_cache, v_cache, plan.block_tables, plan.prefix_lens


def prepare_prefill_args(args: PrefillArgs) -> PrefillLaunchArgs:
    """What the kernel reads for `args`; args.max_seqlen_q (else one device sync here) sizes the grid."""
    spec = _spec(args.q, args.k, args.v, args.causal, _fp8_prefix(args))
    cu_q, cu_k = args.cu_seqlens_q, args.cu_seqlens_k
    batch = cu_q.numel() - 1
    if cu_k.numel() != batch + 1:
        raise ValueError("prefill attention: cu_seqlens_q and cu_seqlens_k differ in batch size")
    k_cache, v_cache, block_tables, prefix_lens = _paged_prefix(args, batch)
    if not (isinstance(args.plan, PrefillPlan) and args.plan.lengths_checked):
        # a tile whose queries see no key would have nothing to wait for: refused here, once per step
        # when the step's plan checked it (the kernel writes O = 0, LSE = -inf for such tiles anyway)
        check_queries_see_keys(cu_q, cu_k, None if args.prefix_lens is None else prefix_lens)
    max_seqlen_q = args.max_seqlen_q
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_q[1:] - cu_q[:-1]).max()) if batch > 0 else 0

    q = _rows_ready(args.q, "q")
    cu_q, cu_k, prefix_lens = as_int32(cu_q), as_int32(cu_k), as_int32(prefix_lens)
    tile_order = _tile_order(args.plan, spec, cu_q, cu_k, prefix_lens, args.k.shape[1], max_seqlen_q)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
    k_scale, v_scale = _scales(args, spec, lse.view(-1)[:args.k.shape[1]])
    return PrefillLaunchArgs(
        spec=spec, q=q, k=_rows_ready(args.k, "k"), v=_rows_ready(args.v, "v"),
        k_cache=_rows_ready(k_cache, "k_cache"), v_cache=_rows_ready(v_cache, "v_cache"),
        block_tables=as_int32(block_tables), prefix_lens=prefix_lens, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        out=torch.empty_like(q), lse=lse, k_scale=k_scale, v_scale=v_scale,
        tile_order=tile_order, softmax_scale_log2=args.scale * math.log2(math.e), max_seqlen_q=max_seqlen_q,
        num_ctas=persistent_ctas(tile_order.numel(), q.device),
    )


def _tile_order(plan, spec: PrefillSpec, cu_q: torch.Tensor, cu_k: torch.Tensor, prefix_lens: torch.Tensor,
                kv_heads: int, max_seqlen_q: int) -> torch.Tensor:
    """The longest-first tile list: built once per step and shape when the step's plan is given (every
    layer reuses it), else per call."""
    key = (spec.tile, spec.qheads_per_kvhead, spec.causal, kv_heads, max_seqlen_q)
    cache = plan.tile_orders if isinstance(plan, PrefillPlan) else {}
    if key not in cache:
        cache[key] = longest_first_tiles(cu_q, cu_k, prefix_lens, kv_heads, spec.qheads_per_kvhead, spec.tile,
                                         spec.causal, max_seqlen_q)
    return cache[key]
