"""Torch entry point: run the sm_90a prefill kernel on CUDA tensors.

Same arguments as reference.prefill_attention_ref (plus optional max_seqlen_q to avoid a host
sync, and return_lse). The kernel comes from the DSL's JIT (each PrefillSpec compiles once per
process: PREFILL_CACHE) or from the ahead-of-time library (aot_loader): see kernel_path.py.
"""
from __future__ import annotations

import torch

from cute_kernels.toolchain.kernel_path import kernel_path
from .prefill_host import PrefillLaunchArgs, prepare_prefill_args


def _as_cute(t: torch.Tensor, dynamic_modes: tuple[int, ...]):
    """DLPack view whose runtime-sized modes are dynamic, matching the fake tensors compiled against."""
    from cutlass.cute.runtime import from_dlpack

    x = from_dlpack(t.detach(), assumed_align=16 if t.element_size() == 2 else 4)
    for mode in dynamic_modes:
        x = x.mark_compact_shape_dynamic(mode=mode, stride_order=t.dim_order())
    return x


# Which modes of each kernel tensor are runtime sizes (head_dim and the 16-token block are static).
_DYNAMIC_MODES = ((0, 1), (0, 1), (0, 1), (0, 2), (0, 2), (0, 1), (0,), (0,), (0,), (0, 1), (0, 1))


def launch_prefill(args: PrefillLaunchArgs) -> None:
    if kernel_path() == "aot":
        from cute_kernels.toolchain.aot_loader import launch_prefill_aot

        return launch_prefill_aot(args)
    _launch_prefill_jit(args)


def _launch_prefill_jit(args: PrefillLaunchArgs) -> None:
    import cuda.bindings.driver as cuda
    import cutlass

    from .prefill_compile import PREFILL_CACHE

    compiled = PREFILL_CACHE.get(args.spec)
    tensors = [_as_cute(t, modes) for t, modes in zip(args.kernel_tensors(), _DYNAMIC_MODES)]
    stream = cuda.CUstream(torch.cuda.current_stream(args.q.device).cuda_stream)
    compiled.fn(*tensors, cutlass.Float32(args.softmax_scale_log2), cutlass.Int32(args.max_seqlen_q), stream)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    scale: float,
    causal: bool = True,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    block_tables: torch.Tensor | None = None,
    prefix_lens: torch.Tensor | None = None,
    *,
    max_seqlen_q: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if not q.is_cuda:
        raise ValueError("prefill_attention (cute): tensors must be on a CUDA device")
    args = prepare_prefill_args(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, k_cache, v_cache,
                                block_tables, prefix_lens, max_seqlen_q)
    if args.max_seqlen_q > 0:
        launch_prefill(args)
    return (args.out, args.lse) if return_lse else args.out
