"""Where a batch-1 decode step's time goes on the CPU, with the default model's quantized weights: the
fused decode step (one C call, runtime/accel/cpu_decode_step.py) against the per-layer path, each
against the weight-bytes floor from this machine's measured read bandwidth, and each GEMV shape's GB/s.

    python profiling/benchmarks/bench_decode_step.py [--steps 200] [--threads 1,2]

Prints ms per step and ratios measured in one run (the machine may be shared: `uptime` is printed
before and after; compare ratios, not figures across runs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def read_bandwidth(threads: int) -> float:
    """GB/s of summing a 256 MiB float32 tensor (best of 5), as torch reads with `threads` threads."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(64 << 20)
    best = min(_timed(data.sum) for _ in range(5))
    return data.numel() * 4 / best / 1e9


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
    args = ap.parse_args()
    import torch

    from cute_kernels.cpu.quant_blocks import BLOCK_BYTES, QK
    from runtime.build import make_runner
    from runtime.load import load_model
    from runtime.sequence import SeqChunk

    print(os.popen("uptime").read().strip())
    cfg, tensors, _, _ = load_model(None)
    runner = make_runner(cfg, tensors, 64 << 20)[0]
    model, fused = runner.model, runner.model.decode_step
    prompt = list(range(100, 142))
    runner.run([SeqChunk(prompt, 0, list(range(8)))])
    ids, positions, batch, _ = runner.prepare([SeqChunk([42], len(prompt), list(range(8)))])
    weights = sum(linear.weight_bytes() for layer in model.layers for linear in layer.linears())
    head = model.head.weight_bytes()
    hidden = torch.randn(1, cfg.hidden_size)
    layer = model.layers[0]
    for threads in (int(t) for t in args.threads.split(",")):
        gbs = read_bandwidth(threads)
        torch.set_num_threads(threads)
        floor = (weights + head) / gbs / 1e6
        model.decode_step = fused
        step = per_call_ms(lambda: model(ids, positions, batch, runner.kv_caches), args.steps)
        model.decode_step = None
        old = per_call_ms(lambda: model(ids, positions, batch, runner.kv_caches), args.steps // 4)
        logits = per_call_ms(lambda: model.logits(hidden), args.steps)
        print(f"threads {threads}: read bandwidth {gbs:.1f} GB/s; layer weights {weights / 1e6:.1f} MB + head "
              f"{head / 1e6:.1f} MB -> floor {floor:.2f} ms/token")
        print(f"  layers: fused step {step:.2f} ms, per-layer path {old:.2f} ms ({old / step:.2f}x); LM head "
              f"{logits:.2f} ms; fused + head = {(weights + head) / (step + logits) / 1e6:.1f} GB/s, "
              f"{floor / (step + logits):.0%} of the floor")
        x = torch.randn(1, cfg.hidden_size)
        for name in layer.LINEARS:
            lin = getattr(layer, name)
            k = lin.blocks.shape[1] // BLOCK_BYTES[lin.type_name] * QK
            xin = torch.randn(1, k) if k != cfg.hidden_size else x
            ms = per_call_ms(lambda: lin(xin), args.steps)
            print(f"  quant_linear {name:<8}{tuple(lin.blocks.shape)!s:>14} {lin.weight_bytes() / ms / 1e6:6.1f} GB/s "
                  f"({ms * 1e3:.0f} us per call)")
    print(os.popen("uptime").read().strip())


if __name__ == "__main__":
    main()
