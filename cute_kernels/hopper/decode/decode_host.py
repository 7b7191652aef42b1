"""Host side of the sm_90a paged decode attention: argument checks, the per-step plan, buffers, and
the torch entry point `decode_attention(args)` (reference.decode_attention_ref's contract on CUDA).

The checks that need the tables' values (block ids in range, lengths within the tables) and the
split count (from the longest context) sync the device, so they live in a DecodePlan made once per
step, outside any CUDA graph: pass it as DecodeArgs.plan and a launch syncs nothing.
Under a captured graph the split count is a grid dimension, so capture each batch size with a plan
of fixed `splits` (e.g. num_splits(batch, kv_heads, max_model_len)) over the static table tensors
(plan_decode keeps int32 contiguous tensors as they are, so in-place updates reach the replay);
padding rows need a context length >= 1 and valid block ids. Any split count is correct for any
context: splits past a sequence's last tile write an empty partial that the merge skips.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cute_kernels.attention_args import DecodeArgs
from cute_kernels.kv_quant import checked_scales
from cute_kernels.paged_tables import KV_BLOCK_SIZE, as_int32, check_block_ids

from .decode_spec import FP8_KV, H100_SMS, MAX_SPLITS, QUERY_ROWS, DecodeMergeSpec, DecodeSpec, num_splits

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass(frozen=True)
class DecodePlan:
    """Tables as the kernel reads them, checked against a cache geometry, and the split count:
    the same for every layer of a step."""

    block_tables: torch.Tensor  # int32 [B, max_blocks]
    context_lens: torch.Tensor  # int32 [B]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    max_seqlen_q: int
    total_q: int  # query rows: cu_seqlens_q[-1]
    num_splits: int
    num_blocks: int


def plan_decode(block_tables: torch.Tensor, context_lens: torch.Tensor, num_blocks: int, kv_heads: int,
                cu_seqlens_q: torch.Tensor | None = None, num_sms: int = H100_SMS,
                splits: int | None = None) -> DecodePlan:
    """Check the tables against a cache of num_blocks blocks (ValueError on lengths past the tables,
    block ids out of range, fewer keys than query tokens) and pick the split count (or take `splits`)."""
    tables, lens = as_int32(block_tables), as_int32(context_lens)
    batch = lens.numel()
    if tables.dim() != 2 or tables.shape[0] != batch or lens.dim() != 1:
        raise ValueError(f"decode attention: block_tables {tuple(tables.shape)} and context_lens "
                         f"{tuple(lens.shape)}: expected [batch, max_blocks] and [batch]")
    if cu_seqlens_q is None:
        cu = torch.arange(batch + 1, dtype=torch.int32, device=lens.device)
        q_lens = torch.ones_like(lens)
    else:
        cu = as_int32(cu_seqlens_q)
        if cu.shape != (batch + 1,):
            raise ValueError(f"decode attention: cu_seqlens_q {tuple(cu.shape)}, expected [{batch + 1}]")
        q_lens = cu[1:] - cu[:-1]
    max_context, max_q = (int(lens.max()), int(q_lens.max())) if batch else (0, 0)
    if int(cu[0]) != 0:
        raise ValueError("decode attention: cu_seqlens_q must start at 0")
    if batch:
        if int(q_lens.min()) < 0 or bool((lens < q_lens).any()) or int(lens.min()) < 1:
            raise ValueError("decode attention: context lengths out of range (each must hold its query tokens)")
        check_block_ids(tables, max_context, num_blocks, KV_BLOCK_SIZE, "decode attention: context lengths")
    if splits is None:
        splits = num_splits(batch, kv_heads, max_context, num_sms)
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"decode attention: {splits} splits, the merge takes 1 to {MAX_SPLITS}")
    return DecodePlan(tables, lens, cu, max_q, int(cu[-1]), splits, num_blocks)


@dataclass
class DecodeLaunchArgs:
    spec: DecodeSpec
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    plan: DecodePlan
    out: torch.Tensor  # like q
    lse: torch.Tensor  # fp32 [tokens, H]
    out_partial: torch.Tensor  # fp32 [splits, tokens, H, d] (a placeholder with one split)
    lse_partial: torch.Tensor  # fp32 [splits, tokens, H]
    softmax_scale_log2: float
    k_scale: torch.Tensor  # fp32 [kv_heads] (e4m3 cache); a 16-bit cache's variant never reads them
    v_scale: torch.Tensor

    @property
    def num_splits(self) -> int:
        return self.plan.num_splits

    @property
    def merge_spec(self) -> DecodeMergeSpec:
        return DecodeMergeSpec(self.spec.dtype, self.spec.head_dim)

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.num_splits, self.k_cache.shape[2], self.plan.context_lens.numel()

    def kernel_tensors(self) -> tuple[torch.Tensor, ...]:
        """Tensors in the argument order of DecodeAttentionSm90.__call__."""
        p = self.plan
        return (self.q, self.k_cache, self.v_cache, p.block_tables, p.context_lens, p.cu_seqlens_q, self.out,
                self.lse, self.out_partial, self.lse_partial, self.k_scale, self.v_scale)

    def merge_tensors(self) -> tuple[torch.Tensor, ...]:
        """Tensors in the argument order of DecodeMergeSm90.__call__."""
        return self.out_partial, self.lse_partial, self.out, self.lse


def _spec(args: DecodeArgs) -> DecodeSpec:
    q, kc, vc = args.q, args.k_cache, args.v_cache
    if q.dim() != 3 or kc.dim() != 4 or vc.shape != kc.shape:
        raise ValueError(f"decode attention: q {tuple(q.shape)}, caches {tuple(kc.shape)}/{tuple(vc.shape)}: "
                         "expected [tokens, heads, d] and two [num_blocks, 16, kv_heads, d]")
    fp8 = kc.dtype == torch.float8_e4m3fn
    if q.dtype not in _DTYPE_NAMES or vc.dtype != kc.dtype or (kc.dtype != q.dtype and not fp8):
        raise ValueError(f"decode attention: dtypes {q.dtype}/{kc.dtype}/{vc.dtype}; need bf16 or fp16 queries "
                         "over a cache of the same type or float8_e4m3fn")
    heads, d = q.shape[1], q.shape[2]
    if kc.shape[1] != KV_BLOCK_SIZE or kc.shape[3] != d or heads % kc.shape[2]:
        raise ValueError(f"decode attention: {heads} query heads of dim {d} over a cache {tuple(kc.shape)} "
                         f"(blocks of {KV_BLOCK_SIZE} tokens, a whole GQA group per KV head)")
    return DecodeSpec(_DTYPE_NAMES[q.dtype], d, FP8_KV if fp8 else None)


def _scales(args: DecodeArgs, spec: DecodeSpec, placeholder: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 cache's fp32 [kv_heads] scales, checked; a 16-bit cache passes `placeholder` (never read)."""
    if not spec.fp8_kv:
        return placeholder, placeholder
    return checked_scales(args.kv_scales, args.k_cache.shape[2], args.q.device, "decode attention")


def _compact(x: torch.Tensor, name: str) -> torch.Tensor:
    """The kernel is compiled for compact row-major tensors on 16-byte boundaries (TMA, cp.async)."""
    if not x.is_contiguous():
        raise ValueError(f"decode attention: {name} must be contiguous (a KV cache is never copied)")
    if x.data_ptr() % 16:
        raise ValueError(f"decode attention: {name} must be 16-byte aligned")
    return x


def prepare_decode_args(args: DecodeArgs, splits: int | None = None) -> DecodeLaunchArgs:
    """What the kernels read for `args` (args.plan: a DecodePlan of these tables, else made here)."""
    spec = _spec(args)
    group = args.q.shape[1] // args.k_cache.shape[2]
    plan = args.plan
    if not isinstance(plan, DecodePlan):
        plan = plan_decode(args.block_tables, args.context_lens, args.k_cache.shape[0], args.k_cache.shape[2],
                           args.cu_seqlens_q, splits=splits)
    if plan.num_blocks != args.k_cache.shape[0]:
        raise ValueError("decode attention: the plan was checked against another cache")
    tokens = args.q.shape[0]
    if tokens != plan.total_q:
        raise ValueError(f"decode attention: {tokens} query rows for {plan.context_lens.numel()} sequences")
    if plan.max_seqlen_q * group > QUERY_ROWS:
        raise ValueError(f"decode attention: {plan.max_seqlen_q} query tokens x GQA group {group} exceed "
                         f"the kernel's {QUERY_ROWS} rows per KV head")
    q = args.q if args.q.is_contiguous() and args.q.data_ptr() % 16 == 0 else args.q.contiguous()
    heads, d = q.shape[1], q.shape[2]
    f32 = dict(dtype=torch.float32, device=q.device)
    partial_rows = (plan.num_splits, tokens) if plan.num_splits > 1 else (1, 1)
    lse = torch.empty(tokens, heads, **f32)
    k_scale, v_scale = _scales(args, spec, lse.view(-1)[:args.k_cache.shape[2]])
    return DecodeLaunchArgs(
        spec=spec, q=q, k_cache=_compact(args.k_cache, "k_cache"), v_cache=_compact(args.v_cache, "v_cache"),
        plan=plan, out=torch.empty_like(q), lse=lse,
        out_partial=torch.empty(*partial_rows, heads, d, **f32), lse_partial=torch.empty(*partial_rows, heads, **f32),
        softmax_scale_log2=args.scale * math.log2(math.e), k_scale=k_scale, v_scale=v_scale,
    )


def decode_attention(args: DecodeArgs, *, return_lse: bool = False,
                     splits: int | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """reference.decode_attention_ref's contract on CUDA tensors (and the fp32 LSE [tokens, heads]
    with return_lse). `splits` overrides the heuristic (tests); a DecodePlan in args.plan fixes it."""
    if not args.q.is_cuda:
        raise ValueError("decode_attention (cute): tensors must be on a CUDA device")
    from .decode_launch import launch_decode

    launch_args = prepare_decode_args(args, splits)
    if launch_args.q.shape[0]:
        launch_decode(launch_args)
    return (launch_args.out, launch_args.lse) if return_lse else launch_args.out
