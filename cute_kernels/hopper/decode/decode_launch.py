"""Launch the decode kernel (and, with several splits, the merge) on torch's current stream: kernels
from the DSL's JIT (DECODE_CACHE: each spec compiles once per process) or from the ahead-of-time
library (decode_aot.py), as toolchain/kernel_path.py says."""
from __future__ import annotations

from typing import Any

import torch

from cute_kernels.toolchain.kernel_path import kernel_path

from ..common.cute_tensors import as_cute

# Which modes of each kernel tensor are runtime sizes (head_dim and the 16-token block are static).
_DECODE_DYNAMIC_MODES = ((0, 1), (0, 2), (0, 2), (0, 1), (0,), (0,), (0, 1), (0, 1), (0, 1, 2), (0, 1, 2), (0,), (0,))
_MERGE_DYNAMIC_MODES = ((0, 1, 2), (0, 1, 2), (0, 1), (0, 1))


def launch_decode(args: Any) -> None:
    """Launch for a decode_host.DecodeLaunchArgs (not imported: decode_host imports this module)."""
    if kernel_path() == "aot":
        from .decode_aot import launch_decode_aot

        return launch_decode_aot(args)
    _launch_decode_jit(args)


def _launch_decode_jit(args: Any) -> None:
    import cuda.bindings.driver as cuda
    import cutlass

    from .decode_compile import DECODE_CACHE

    stream = cuda.CUstream(torch.cuda.current_stream(args.q.device).cuda_stream)
    tensors = [as_cute(t, modes) for t, modes in zip(args.kernel_tensors(), _DECODE_DYNAMIC_MODES)]
    DECODE_CACHE.get(args.spec).fn(*tensors, cutlass.Float32(args.softmax_scale_log2),
                                   cutlass.Int32(args.num_splits), stream)
    if args.num_splits > 1:
        tensors = [as_cute(t, modes) for t, modes in zip(args.merge_tensors(), _MERGE_DYNAMIC_MODES)]
        DECODE_CACHE.get(args.merge_spec).fn(*tensors, stream)
