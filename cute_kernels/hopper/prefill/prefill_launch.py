"""Torch entry point: run the sm_90a prefill kernel on CUDA tensors.

Takes the PrefillArgs record of reference.prefill_attention_ref (its max_seqlen_q spares a host
sync; return_lse also returns the LSE). The kernel comes from the DSL's JIT (each PrefillSpec
compiles once per process: PREFILL_CACHE) or from the ahead-of-time library (toolchain/aot_loader):
see toolchain/kernel_path.py.
"""
from __future__ import annotations

import torch

from cute_kernels.attention_args import PrefillArgs
from cute_kernels.toolchain.kernel_path import kernel_path

from ..common.cute_tensors import as_cute
from .prefill_host import PrefillLaunchArgs, prepare_prefill_args

# Which modes of each kernel tensor are runtime sizes (head_dim and the 16-token block are static).
_DYNAMIC_MODES = ((0, 1), (0, 1), (0, 1), (0, 2), (0, 2), (0, 1), (0,), (0,), (0,), (0, 1), (0, 1), (0,), (0,), (0,))


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
    tensors = [as_cute(t, modes) for t, modes in zip(args.kernel_tensors(), _DYNAMIC_MODES)]
    stream = cuda.CUstream(torch.cuda.current_stream(args.q.device).cuda_stream)
    compiled.fn(*tensors, cutlass.Float32(args.softmax_scale_log2), cutlass.Int32(args.max_seqlen_q),
                cutlass.Int32(args.num_ctas), stream)


def prefill_attention(args: PrefillArgs, *,
                      return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """reference.prefill_attention_ref's contract on CUDA tensors (and the fp32 LSE [tokens, heads]
    with return_lse); args.max_seqlen_q, when given, spares a device sync."""
    if not args.q.is_cuda:
        raise ValueError("prefill_attention (cute): tensors must be on a CUDA device")
    launch_args = prepare_prefill_args(args)
    if launch_args.max_seqlen_q > 0:
        launch_prefill(launch_args)
    return (launch_args.out, launch_args.lse) if return_lse else launch_args.out
