"""The CPU backend's own ops against the torch ops they replace, same inputs, same process:

    python profiling/bench_cpu_ops.py [--repeats 20] [--json PATH]

- decode attention: the C paged kernel (cute_kernels/cpu_decode_attention.py) vs the torch
  reference decode_attention_ref, SmolLM2-135M shapes (9 query / 3 KV heads, d 64), batch x context.
- linear: oneDNN with the weight packed once (runtime/model/cpu_linear.py) vs F.linear, the model's
  four layer shapes and its LM head, by rows (decode batch sizes up to prefill chunks).
Prints median milliseconds and the speed-up (torch / ours).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cute_kernels.attention_ref import decode_attention_ref, plan_decode  # noqa: E402
from cute_kernels.cpu_decode_attention import decode_attention_cpu, prepare_tables, unavailable_reason  # noqa: E402
from runtime.model.cpu_linear import pack_linear_weight, packed_linear  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def attention_cases(repeats: int) -> list[dict]:
    rows = []
    heads, kv_heads, d, bs = 9, 3, 64, 16
    for batch, context in [(1, 512), (8, 512), (64, 128), (64, 400), (64, 1024)]:
        g = torch.Generator().manual_seed(0)
        blocks = (context + bs - 1) // bs
        k_cache = torch.randn(batch * blocks + 1, bs, kv_heads, d, generator=g)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(batch * blocks, generator=g).view(batch, blocks).int()
        lens = torch.full((batch,), context, dtype=torch.int32)
        q = torch.randn(batch, heads, d, generator=g)
        # the engine plans once per step for all layers, so neither plan is timed here
        plan, prepared = plan_decode(tables, lens, k_cache), prepare_tables(tables, lens, k_cache)
        ref = median_ms(lambda: decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125, plan), repeats)
        ours = median_ms(lambda: decode_attention_cpu(q, k_cache, v_cache, tables, lens, 0.125, prepared), repeats)
        rows.append({"op": "decode attention", "case": f"batch {batch} x context {context}",
                     "torch_ms": ref, "ours_ms": ours, "speedup": ref / ours})
    return rows


def linear_cases(repeats: int) -> list[dict]:
    rows = []
    shapes = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
              "lm_head": (49152, 576)}
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k)
        packed = pack_linear_weight(w)
        if packed is None:
            raise SystemExit("oneDNN packing is unavailable in this torch build")
        for m in (1, 8, 64, 256, 1024):
            if name == "lm_head" and m > 64:
                continue  # the LM head only sees the sampled rows
            x = torch.randn(m, k)
            ref = median_ms(lambda: F.linear(x, w), repeats)
            ours = median_ms(lambda: packed_linear(x, packed, None), repeats)
            rows.append({"op": f"linear {name}", "case": f"{m} rows", "torch_ms": ref, "ours_ms": ours,
                         "speedup": ref / ours})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if unavailable_reason() is not None:
        print(f"the C decode attention is unavailable: {unavailable_reason()}", file=sys.stderr)
        return 1
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = attention_cases(args.repeats) + linear_cases(args.repeats)
    print(f"{'op':<20} {'case':<28} {'torch ms':>9} {'ours ms':>9} {'speed-up':>9}")
    for r in rows:
        print(f"{r['op']:<20} {r['case']:<28} {r['torch_ms']:>9.3f} {r['ours_ms']:>9.3f} {r['speedup']:>8.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
