"""Timing on the GPU and the chip's dense 16-bit tensor-core peak, read from the device name.

Peaks are NVIDIA's published dense (no sparsity) BF16/FP16 figures: H100 SXM and H200 989 TFLOP/s,
H100 NVL 835, H100 PCIe 756 (lower clocks and power), H800 989, H20 148.
"""
from __future__ import annotations

# Most specific names first: "H100 PCIe" must not match the SXM entry.
DENSE_BF16_PEAK_TFLOPS = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5 (device name "NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
)


def peak_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of the device called `device_name`, or None for a chip not in the table."""
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS if key in device_name), None)


def time_ms(fn, warmup: int = 3, iters: int = 10) -> float:
    """Mean milliseconds of fn() over `iters` launches on the current stream, after `warmup`."""
    import torch

    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters
