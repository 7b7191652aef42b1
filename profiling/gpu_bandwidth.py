"""The device's measured copy bandwidth: the roof a bandwidth-bound kernel or decode step is compared to."""
from __future__ import annotations

import torch


def copy_bandwidth_gbs(nbytes: int = 2 << 30, iters: int = 10) -> float:
    """GB/s of a device-to-device copy of `nbytes` (read + write counted), best of `iters`."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / best / 1e9
