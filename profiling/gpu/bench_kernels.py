"""Kernel benchmarks on the GPU: `python profiling/gpu/bench_kernels.py {prefill,decode,fused,fp8,fp8_engine}
[--json PATH] [--dry-run]`.

prefill (profiling/gpu/bench_prefill.py): the cute sm_90a prefill kernel vs torch SDPA with the cuDNN and
flash backends on the same inputs, TFLOP/s over the visible score entries and the fraction of the
device's dense bf16 peak (profiling/gpu/gpu_peaks.py). One row per case; `path` says whether the kernel
ran JIT-compiled (DSL) or from the AOT library (cute_kernels.toolchain.kernel_path).
decode: the paged split-KV decode kernel's bandwidth as a fraction of the measured device copy
bandwidth, beside the torch reference and FlashInfer / flash-attn when importable (profiling/gpu/decode_bench.py).
fused: the fused elementwise kernels vs the device copy bandwidth and the torch references (bench_fused.py).
fp8: the FP8 GEMM beside torch._scaled_mm and bf16 matmul (profiling/gpu/bench_fp8.py); fp8_engine: batch-1
decode TPOT of an 8B-shaped model, --quantization fp8 vs bf16 (profiling/gpu/bench_fp8_engine.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from profiling.gpu.bench_fp8_engine import run_fp8_engine  # noqa: E402
from profiling.gpu.bench_prefill import run_prefill  # noqa: E402
from profiling.gpu.gpu_peaks import time_ms  # noqa: E402


def run_decode(dry_run: bool) -> list[dict]:
    from profiling.gpu.decode_bench import run_decode_bench

    return run_decode_bench(dry_run, time_ms)


def run_fused(dry_run: bool) -> list[dict]:
    from profiling.gpu.bench_fused import run

    return run(dry_run, time_ms)


def run_fp8(dry_run: bool) -> list[dict]:
    from profiling.gpu.bench_fp8 import run_fp8_bench

    return run_fp8_bench(dry_run, time_ms)


BENCHES = {"prefill": run_prefill, "decode": run_decode, "fused": run_fused, "fp8": run_fp8,
           "fp8_engine": run_fp8_engine}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", choices=sorted(BENCHES))
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--dry-run", action="store_true", help="list the cases without a GPU")
    args = parser.parse_args(argv)
    rows = BENCHES[args.bench](args.dry_run)
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
