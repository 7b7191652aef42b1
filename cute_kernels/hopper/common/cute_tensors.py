"""torch tensors as the DSL's compiled kernels take them (the JIT launch path)."""
from __future__ import annotations

import torch


def as_cute(t: torch.Tensor, dynamic_modes: tuple[int, ...]):
    """DLPack view whose runtime-sized modes are dynamic, matching the fake tensors compiled against."""
    from cutlass.cute.runtime import from_dlpack

    x = from_dlpack(t.detach(), assumed_align=16 if t.element_size() == 2 else 4)
    for mode in dynamic_modes:
        x = x.mark_compact_shape_dynamic(mode=mode, stride_order=t.dim_order())
    return x
