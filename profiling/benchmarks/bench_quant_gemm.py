"""The quantized CPU linear's paths side by side on the default model's shapes, in one run: the int8
GEMV (cpu_quant_gemm.c), the register-blocked int8 GEMM (cpu_quant_tiles.c), dequantize + torch fp32
GEMM, and plain fp32 F.linear on the already-dequantized weight (what --quantization none runs).

    python profiling/benchmarks/bench_quant_gemm.py [--types Q4_1,Q8_0] [--rows 16,64,128,512,2048] [--threads N]
        [--prefill-split TOKENS]

Prints GFLOP/s per path and each path's ratio to fp32 F.linear (on CPUs with AMX also the AMX tiles' linear
against fp32 and torch's bf16 F.linear, and gate/up joined with its SiLU against the two apart), the tiles GEMM's share of this machine's
measured int8 peak (quant_tiles.int8_peak_gops: 12 independent vpdpbusd per round on every thread), and
the path quant_gemm.choose_path takes; TILES_ROWS in quant_gemm.py is set from these. --prefill-split
runs one prompt of TOKENS tokens of the default model through the engine (prefix caching off) and splits
its prefill time into the linears, the attention and the rest (norms, RoPE, embedding, head, Python). Timings are the best of --repeat runs (the
machine may be shared; --clock cpu counts CPU time instead of wall time). The GEMV is skipped above --gemv-max-rows (it is far behind there), the
49152-row LM head above 128 rows (a prefill computes logits for the last tokens only).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cute_kernels.cpu import quant_gemm as qg  # noqa: E402
from cute_kernels.cpu import quant_tiles  # noqa: E402
from cute_kernels.cpu.quant_blocks import dequantize, quantize_q4_1, quantize_q8_0  # noqa: E402
from profiling.common.prefill_split import prefill_split  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)}
QUANTIZERS = {"Q4_1": quantize_q4_1, "Q8_0": quantize_q8_0}
HEAD_MAX_ROWS = 128


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def best_seconds(fn, repeat: int, clock) -> float:
    fn()  # warm-up: builds, buffers, caches
    times = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def measure(shape: tuple[int, int], type_name: str, rows: int, args) -> dict[str, float]:
    n, k = shape
    g = torch.Generator().manual_seed(0)
    blocks = QUANTIZERS[type_name](torch.randn(n, k, generator=g) * 0.05)
    w = dequantize(blocks, type_name, k)
    x = torch.randn(rows, k, generator=g)
    runs = {"tiles": lambda: qg.quant_linear(x, blocks, type_name, path="tiles"),
            "dequant": lambda: qg.quant_linear(x, blocks, type_name, path="dequant"),
            "fp32": lambda: F.linear(x, w)}
    if rows <= args.gemv_max_rows:
        runs["gemv"] = lambda: qg.quant_linear(x, blocks, type_name, path="gemv")
    flops = 2.0 * rows * n * k
    return {name: flops / best_seconds(fn, args.repeat, CLOCKS[args.clock]) / 1e9 for name, fn in runs.items()}


def amx_rows(args) -> None:
    """On CPUs with AMX: the tiles' linear on grouped blocks (what prefill rows take there) against fp32 F.linear
    and torch's bf16 F.linear (oneDNN, on AMX too, bf16 in and out), and gate/up joined with its SiLU
    (quant_amx.amx_glu) against the tiles' linear then silu_and_mul, the path without it."""
    from cute_kernels.cpu import fused_ops, quant_amx, row_groups

    if not quant_amx.available():
        return
    print("AMX tiles on grouped blocks: GFLOP/s (x fp32 F.linear, x torch bf16 F.linear); gate_up: joined with "
          "SiLU x the linear + silu_and_mul")
    best = lambda fn: best_seconds(fn, args.repeat, CLOCKS[args.clock])  # noqa: E731
    for type_name in filter(None, args.types.split(",")):
        for shape_name in (s for s in args.shapes.split(",") if s != "head"):
            for rows in (r for r in map(int, args.rows.split(",")) if r >= qg.AMX_MIN_ROWS):
                (n, k), g = SHAPES[shape_name], torch.Generator().manual_seed(0)
                blocks = QUANTIZERS[type_name](torch.randn(n, k, generator=g) * 0.05)
                w, kind, grouped = dequantize(blocks, type_name, k), row_groups.GROUPED[type_name], row_groups.group(
                    blocks, type_name)
                x = torch.randn(rows, k, generator=g)
                xb, wb = x.bfloat16(), w.bfloat16()
                amx = best(lambda: quant_amx.amx_linear(x, grouped, kind, None, args.threads))
                line = (f"{type_name:5} {shape_name:8} {rows:5} | {2.0 * rows * n * k / amx / 1e9:7.1f} "
                        f"({best(lambda: F.linear(x, w)) / amx:4.2f}, {best(lambda: F.linear(xb, wb)) / amx:4.2f})")
                if shape_name == "gate_up":
                    apart = best(lambda: fused_ops.silu_and_mul(quant_amx.amx_linear(x, grouped, kind, None, args.threads)))
                    line += f" | joined {apart / best(lambda: quant_amx.amx_glu(x, grouped, kind, args.threads)):4.2f}x"
                print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_1,Q8_0")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default="16,64,128,512,2048")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clock", choices=CLOCKS, default="wall",
                    help="cpu: process CPU time (all threads), steadier than wall time on a shared machine")
    ap.add_argument("--gemv-max-rows", type=int, default=128)
    ap.add_argument("--prefill-split", type=int, default=0, metavar="TOKENS",
                    help="also split one TOKENS-token prefill of the default model (0: skip)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    peak = quant_tiles.int8_peak_gops(args.threads, clock=CLOCKS[args.clock])
    print(f"tiles ISA {quant_tiles.isa()}, GEMV ISA {qg.isa()}, {args.threads} threads, {args.clock} clock; "
          f"int8 peak {f'{peak:.0f} GOP/s' if peak else 'n/a'}; GFLOP/s (x fp32 F.linear)")
    print(f"{'type':5} {'shape':8} {'rows':>5} | {'gemv':>13} {'tiles':>13} {'dequant':>13} {'fp32':>7} | "
          f"{'peak':>5} | chosen")
    for type_name in filter(None, args.types.split(",")):
        for shape_name in args.shapes.split(","):
            for rows in map(int, args.rows.split(",")):
                if shape_name == "head" and rows > HEAD_MAX_ROWS:
                    continue
                r = measure(SHAPES[shape_name], type_name, rows, args)
                cells = [f"{r[p]:6.1f} ({r[p] / r['fp32']:4.2f})" if p in r else f"{'-':>13}"
                         for p in ("gemv", "tiles", "dequant")]
                share = f"{r['tiles'] / peak:5.0%}" if peak else f"{'-':>5}"
                print(f"{type_name:5} {shape_name:8} {rows:5} | {' '.join(cells)} {r['fp32']:7.1f} | {share} | "
                      f"{qg.choose_path(type_name, rows)}", flush=True)
    amx_rows(args)
    if args.prefill_split:
        prefill_split(args.prefill_split, args.repeat, peak, CLOCKS[args.clock])


if __name__ == "__main__":
    main()
