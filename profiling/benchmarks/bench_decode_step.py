"""Where a decode step's time goes on the CPU (batch 1, or --rows sequences at once), with the default model's
quantized weights: the fused decode step (one C call, runtime/accel/cpu_decode_step.py) against the per-layer path, each
against the bytes floor (weights + the KV cache a token reads) from this machine's read bandwidth,
and each GEMV shape's GB/s. The bandwidth is measured by a STREAM-like C read kernel
(csrc/cpu_read_bandwidth.c: every thread sums its own part of 512 MiB); torch's sum is printed beside it.

    python profiling/benchmarks/bench_decode_step.py [--steps 200] [--threads 1,2] [--contexts 42,2048]
        [--kv-cache-dtype bf16] [--rows 1,32]

Prints ms per step and ratios measured in one run (the machine may be shared: `uptime` is printed
before and after; compare ratios, not figures across runs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import runtime  # noqa: E402,F401  first: it sets OpenMP's barrier spin before torch loads (runtime/omp_wait.py)

READ_BYTES = 512 << 20  # far past the last-level cache


def read_bandwidth(threads: int) -> tuple[float, float]:
    """GB/s (best of 5) of reading READ_BYTES of float32 with `threads` threads: (the C read kernel, torch's sum)."""
    import ctypes

    import torch

    from cute_kernels.cpu import build

    torch.set_num_threads(threads)
    data = torch.ones(READ_BYTES // 4)
    lib, reason = build.load_with_signatures(
        "cpu_read_bandwidth", {"read_sum_f32": ([ctypes.c_void_p, ctypes.c_int64, ctypes.c_int], ctypes.c_double)})
    if lib is None:
        raise SystemExit(f"the read kernel did not build: {reason}")
    kernel = min(_timed(lambda: lib.read_sum_f32(data.data_ptr(), data.numel(), threads)) for _ in range(5))
    summed = min(_timed(data.sum) for _ in range(5))
    return READ_BYTES / kernel / 1e9, READ_BYTES / summed / 1e9


def kv_bytes_per_token(cfg, context: int, kv_dtype) -> int:
    """The K and V rows one decode token reads at this context, over all layers."""
    import torch

    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * context * torch.empty((), dtype=kv_dtype).element_size()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def per_call_ms(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--contexts", default="42,2048", help="tokens of context a decoded token attends to")
    ap.add_argument("--rows", default="1", help="sequences decoding together, e.g. 1,8,32,64 (one token each)")
    ap.add_argument("--kv-cache-dtype", default="bf16", choices=("float32", "bf16"),
                    help="the cache the fused step reads (default: the engine's CPU default)")
    args = ap.parse_args()
    import torch

    from runtime.load import load_model

    print(os.popen("uptime").read().strip())
    kv_dtype = {"float32": torch.float32, "bf16": torch.bfloat16}[args.kv_cache_dtype]
    cfg, tensors, _, _ = load_model(None)
    for threads in (int(t) for t in args.threads.split(",")):
        gbs, torch_gbs = read_bandwidth(threads)
        print(f"threads {threads}: read bandwidth {gbs:.1f} GB/s (C read kernel; torch's sum {torch_gbs:.1f} GB/s)")
        for rows in (int(r) for r in args.rows.split(",")):
            for context in (int(c) for c in args.contexts.split(",")):
                step_at(cfg, tensors, context, kv_dtype, threads, gbs, args.steps, rows)
    print(os.popen("uptime").read().strip())


def step_at(cfg, tensors: dict, context: int, kv_dtype, threads: int, gbs: float, steps: int, rows: int = 1) -> None:
    """One decode step of `rows` sequences at `context` tokens of context each: the fused step and the
    per-layer path against the bytes floor; the GEMV shapes once, at batch 1 and the shortest context."""
    import torch

    from cute_kernels.cpu.quant_blocks import BLOCK_BYTES, QK
    from runtime.build import make_runner
    from runtime.sequence import SeqChunk

    block = 16
    per_seq = context // block + 2
    tables = [list(range(r * per_seq, (r + 1) * per_seq)) for r in range(rows)]
    runner = make_runner(cfg, dict(tensors), (rows * per_seq + 4) * block * kv_bytes_per_token(cfg, 1, kv_dtype),
                         kv_dtype=kv_dtype)[0]
    model, fused = runner.model, runner.model.decode_step
    prompts = [[100 + (i + 7 * r) % 1000 for i in range(context - 1)] for r in range(rows)]
    for prompt, blocks in zip(prompts, tables):
        runner.run([SeqChunk(prompt, 0, blocks)])
    ids, positions, batch, _ = runner.prepare([SeqChunk([42], context - 1, blocks) for blocks in tables])
    weights = sum(linear.weight_bytes() for layer in model.layers for linear in layer.linears())
    head, kv = model.head.weight_bytes(), rows * kv_bytes_per_token(cfg, context, kv_dtype)
    torch.set_num_threads(threads)
    floor = (weights + head + kv) / gbs / 1e6
    model.decode_step = fused
    step = per_call_ms(lambda: model(ids, positions, batch, runner.kv_caches), steps)
    model.decode_step = None
    old = per_call_ms(lambda: model(ids, positions, batch, runner.kv_caches), max(1, steps // 4))
    hidden = torch.randn(rows, cfg.hidden_size)
    alone = per_call_ms(lambda: model.logits(hidden), steps)
    # the head as the engine runs it, after a step that streamed the layers' weights through the caches:
    # called back to back, its 30 MB stay partly cached and it looked ~2.5x faster than in the engine
    model.decode_step = fused
    logits = per_call_ms(lambda: (model(ids, positions, batch, runner.kv_caches), model.logits(hidden)), steps) - step
    print(f"  {rows} row{'s' * (rows > 1)}, context {context}: layer weights {weights / 1e6:.1f} MB + head {head / 1e6:.1f} MB + KV "
          f"{kv / 1e6:.1f} MB ({str(kv_dtype).removeprefix('torch.')}) -> floor {floor:.2f} ms/step")
    print(f"    layers: fused step {step:.2f} ms, per-layer path {old:.2f} ms ({old / step:.2f}x); LM head "
          f"{logits:.2f} ms after the step ({alone:.2f} ms called alone); fused + head = "
          f"{(weights + head + kv) / (step + logits) / 1e6:.1f} GB/s, "
          f"{floor / (step + logits):.0%} of the read bandwidth")
    if context > 64 or rows > 1:
        return
    layer, x = model.layers[0], torch.randn(1, cfg.hidden_size)
    for name in layer.LINEARS:
        lin = getattr(layer, name)
        k = lin.blocks.shape[1] // BLOCK_BYTES[lin.type_name] * QK
        xin = torch.randn(1, k) if k != cfg.hidden_size else x
        ms = per_call_ms(lambda: lin(xin), steps)
        print(f"    quant_linear {name:<8}{tuple(lin.blocks.shape)!s:>14} {lin.weight_bytes() / ms / 1e6:6.1f} GB/s "
              f"({ms * 1e3:.0f} us per call)")


if __name__ == "__main__":
    main()
