"""Kernel benchmarks on the GPU: `python profiling/bench_kernels.py {prefill,decode,fp8,fp8_engine} [--json PATH]
[--dry-run]`.

prefill: the cute sm_90a prefill kernel vs torch SDPA (flash backend) on the same inputs, causal
TFLOP/s (half the square counted) and the fraction of the chip's dense bf16 peak. One row per case;
`path` says whether the kernel ran JIT-compiled (DSL) or from the AOT library
(cute_kernels.toolchain.kernel_path).
decode: the paged split-KV decode kernel's bandwidth as a fraction of the measured device copy
bandwidth, beside the torch reference and FlashInfer / flash-attn when importable (profiling/decode_bench.py).
fp8: the FP8 GEMM beside torch._scaled_mm and bf16 matmul (profiling/bench_fp8.py); fp8_engine: batch-1
decode TPOT of an 8B-shaped model, --quantization fp8 vs bf16 (profiling/bench_fp8_engine.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiling.bench_fp8_engine import run_fp8_engine  # noqa: E402

DENSE_BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "H20": 148.0}


@dataclass(frozen=True)
class PrefillCase:
    batch: int
    seqlen: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def name(self) -> str:
        return f"b{self.batch} L{self.seqlen} h{self.heads}:{self.kv_heads} d{self.head_dim}"

    def causal_flops(self) -> float:
        # QK^T and PV: 2 GEMMs x 2 flops per MAC, over the causal half of L x L.
        return 4.0 * self.batch * self.heads * self.seqlen * self.seqlen * self.head_dim / 2


PREFILL_CASES = [
    PrefillCase(4, 4096, 32, 8, 128),  # the target shape
    PrefillCase(4, 4096, 32, 8, 64),
    PrefillCase(16, 1024, 32, 8, 128),
]


def _time_ms(fn, warmup: int = 3, iters: int = 10) -> float:
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


def _peak_tflops() -> float | None:
    import torch

    name = torch.cuda.get_device_name()
    return next((peak for key, peak in DENSE_BF16_PEAK_TFLOPS.items() if key in name), None)


def bench_prefill_case(case: PrefillCase) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cute_kernels.attention_args import PrefillArgs
    from cute_kernels.hopper.prefill_host import prepare_prefill_args
    from cute_kernels.hopper.prefill_launch import launch_prefill
    from cute_kernels.toolchain.kernel_path import kernel_path

    dev, dt = "cuda", torch.bfloat16
    tokens = case.batch * case.seqlen
    q = torch.randn(tokens, case.heads, case.head_dim, device=dev, dtype=dt)
    k = torch.randn(tokens, case.kv_heads, case.head_dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    cu = torch.arange(0, tokens + 1, case.seqlen, device=dev, dtype=torch.int32)
    scale = case.head_dim ** -0.5
    args = prepare_prefill_args(PrefillArgs(q, k, v, cu, cu, scale, True, max_seqlen_q=case.seqlen))
    cute_ms = _time_ms(lambda: launch_prefill(args))

    # SDPA on [B, H, L, d]; KV heads expanded outside the timed region.
    group = case.heads // case.kv_heads
    qs = q.view(case.batch, case.seqlen, case.heads, -1).transpose(1, 2)
    ks = k.view(case.batch, case.seqlen, case.kv_heads, -1).repeat_interleave(group, 2).transpose(1, 2)
    vs = v.view(case.batch, case.seqlen, case.kv_heads, -1).repeat_interleave(group, 2).transpose(1, 2)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa_ms = _time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale))

    flops = case.causal_flops()
    cute_tflops, sdpa_tflops = flops / cute_ms / 1e9, flops / sdpa_ms / 1e9
    peak = _peak_tflops()
    return {"case": case.name, "path": kernel_path(), "cute_ms": round(cute_ms, 3),
            "cute_tflops": round(cute_tflops, 1), "sdpa_tflops": round(sdpa_tflops, 1),
            "vs_sdpa": round(cute_tflops / sdpa_tflops, 2),
            "of_peak": round(cute_tflops / peak, 2) if peak else None}


def run_prefill(dry_run: bool) -> list[dict]:
    if dry_run:
        from cute_kernels.toolchain.kernel_path import kernel_path

        return [{"case": c.name, "path": kernel_path(), "gflop": round(c.causal_flops() / 1e9, 1), "dry_run": True}
                for c in PREFILL_CASES]
    rows = []
    for case in PREFILL_CASES:
        try:
            rows.append(bench_prefill_case(case))
        except Exception as exc:  # one failing case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows


def run_decode(dry_run: bool) -> list[dict]:
    from profiling.decode_bench import run_decode_bench

    return run_decode_bench(dry_run, _time_ms)


def run_fp8(dry_run: bool) -> list[dict]:
    from profiling.bench_fp8 import run_fp8_bench

    return run_fp8_bench(dry_run, _time_ms)


BENCHES = {"prefill": run_prefill, "decode": run_decode, "fp8": run_fp8, "fp8_engine": run_fp8_engine}


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
