"""torch tensors as the DSL's compiled kernels take them (the JIT launch path)."""
from __future__ import annotations

import torch


def as_cute(t: torch.Tensor, dynamic_modes: tuple[int, ...]):
    """DLPack view whose runtime-sized modes are dynamic, matching the fake tensors compiled against.
    DLPack has no fp8: an e4m3 tensor travels as uint8 and gets its element type back here."""
    import cutlass
    from cutlass.cute.runtime import from_dlpack

    is_fp8 = t.dtype == torch.float8_e4m3fn
    x = from_dlpack((t.view(torch.uint8) if is_fp8 else t).detach(), assumed_align=16 if t.element_size() <= 2 else 4)
    if is_fp8:
        x.element_type = cutlass.Float8E4M3FN
    for mode in dynamic_modes:
        x = x.mark_compact_shape_dynamic(mode=mode, stride_order=t.dim_order())
    return x
