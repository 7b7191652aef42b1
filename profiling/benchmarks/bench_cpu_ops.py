"""The CPU backend's own ops against the torch ops they replace, same inputs, same process:

    python profiling/benchmarks/bench_cpu_ops.py [--repeats 20] [--json PATH]

- decode attention: the C paged kernel (cute_kernels/cpu/decode_attention.py) vs the torch
  reference decode_attention_ref, SmolLM2-135M shapes (9 query / 3 KV heads, d 64), batch x context.
- prefill attention: the C varlen kernel (cute_kernels/cpu/prefill_attention.py) vs
  prefill_attention_ref (torch SDPA per sequence), whole prompts and a chunk after a cached prefix; then
  over a bf16 cache, each bf16 kernel this CPU runs (AMX tiles, vdpbf16ps) vs our fp32 kernel.
- fused elementwise ops (cute_kernels/cpu/fused_ops.py) vs their torch references, by rows.
- linear: oneDNN with the weight packed once (runtime/accel/cpu_linear.py) vs F.linear, the model's
  four layer shapes and its LM head, by rows (decode batch sizes up to prefill chunks).
- sampling: runtime/sampling/sampler.py's sample() vs transformers' recipe (sort-based top-k/top-p warpers,
  softmax, torch.multinomial) on 64 rows of the default model's real next-token logits.
Prints median milliseconds and the speed-up (torch / ours; for the bf16 kernels, our fp32 kernel / them).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cute_kernels.attention_args import DecodeArgs, PrefillArgs  # noqa: E402
from cute_kernels.cpu import decode_attention as cpu_decode_attention  # noqa: E402
from cute_kernels.cpu import fused_ops as fused  # noqa: E402
from cute_kernels.cpu import prefill_attention as cpu_prefill_attention  # noqa: E402
from cute_kernels.cpu.decode_attention import decode_attention_cpu, prepare_tables  # noqa: E402
from cute_kernels.reference import (  # noqa: E402
    add_rms_norm_ref,
    decode_attention_ref,
    plan_decode,
    prefill_attention_ref,
    rope_ref,
    silu_and_mul_ref,
)
from runtime.accel.cpu_linear import pack_linear_weight, packed_linear  # noqa: E402
from runtime.accel.host_allocator import tune_host_allocator  # noqa: E402


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
    cases = [(1, 512, torch.float32), (8, 512, torch.float32), (64, 128, torch.float32), (64, 400, torch.float32),
             (64, 1024, torch.float32), (32, 300, torch.bfloat16), (64, 400, torch.bfloat16)]  # bf16: the CPU default
    for batch, context, dtype in cases:
        g = torch.Generator().manual_seed(0)
        blocks = (context + bs - 1) // bs
        k_cache = torch.randn(batch * blocks + 1, bs, kv_heads, d, generator=g).to(dtype)
        v_cache = torch.randn(k_cache.shape, generator=g).to(dtype)
        tables = torch.randperm(batch * blocks, generator=g).view(batch, blocks).int()
        lens = torch.full((batch,), context, dtype=torch.int32)
        q = torch.randn(batch, heads, d, generator=g)
        # the engine plans once per step for all layers, so neither plan is timed here
        plan, prepared = plan_decode(tables, lens, bs), prepare_tables(tables, lens, *k_cache.shape[:2])
        ref_args = DecodeArgs(q, k_cache, v_cache, tables, lens, 0.125, plan)
        ours_args = DecodeArgs(q, k_cache, v_cache, tables, lens, 0.125, prepared)
        ref = median_ms(lambda: decode_attention_ref(ref_args), repeats)
        ours = median_ms(lambda: decode_attention_cpu(ours_args), repeats)
        kv = "" if dtype == torch.float32 else ", bf16 KV"
        rows.append({"op": "decode attention", "case": f"batch {batch} x context {context}{kv}",
                     "torch_ms": ref, "ours_ms": ours, "speedup": ref / ours})
    return rows


def prefill_cases(repeats: int) -> list[dict]:
    rows = []
    heads, kv_heads, d, bs = 9, 3, 64, 16
    g = torch.Generator().manual_seed(0)
    mixed = torch.randint(32, 513, (14,), generator=g).tolist()  # the offline benchmark's prompt range
    for name, q_lens, prefix in [("8 prompts x 512", [512] * 8, 0), (f"{len(mixed)} prompts of 32-512", mixed, 0),
                                 ("4 chunks of 512 after 1536 cached", [512] * 4, 1536)]:
        total, blocks = sum(q_lens), (prefix + bs - 1) // bs
        q = torch.randn(total, heads, d, generator=g)
        k, v = torch.randn(total, kv_heads, d, generator=g), torch.randn(total, kv_heads, d, generator=g)
        cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        k_cache = torch.randn(len(q_lens) * blocks + 1, bs, kv_heads, d, generator=g)
        v_cache = torch.randn_like(k_cache)
        tables = torch.arange(len(q_lens) * blocks).view(len(q_lens), blocks).int()
        prefixes = torch.full((len(q_lens),), prefix, dtype=torch.int32) if prefix else None
        args = PrefillArgs(q, k, v, cu, cu, 0.125, True, k_cache, v_cache, tables, prefixes)
        ref = median_ms(lambda: prefill_attention_ref(args), repeats)
        ours = median_ms(lambda: cpu_prefill_attention.prefill_attention_cpu(args), repeats)
        rows.append({"op": "prefill attention", "case": name, "torch_ms": ref, "ours_ms": ours, "speedup": ref / ours})
        rows += bf16_kernel_rows(args, name, repeats)
    return rows


def bf16_kernel_rows(args: PrefillArgs, name: str, repeats: int) -> list[dict]:
    """The same case over a bf16 cache (the CPU default): each bf16 kernel this CPU has against our fp32 kernel."""
    k16, v16 = args.k_cache.bfloat16(), args.v_cache.bfloat16()
    args = PrefillArgs(args.q, args.k, args.v, args.cu_seqlens_q, args.cu_seqlens_k, args.scale, args.causal,
                       k16, v16, args.block_tables, args.prefix_lens)
    base = median_ms(lambda: cpu_prefill_attention.prefill_attention_cpu(args, "fp32"), repeats)
    return [{"op": f"prefill attn {kernel}", "case": f"{name}, bf16 KV", "torch_ms": base,
             "ours_ms": (ms := median_ms(lambda k=kernel: cpu_prefill_attention.prefill_attention_cpu(args, k), repeats)),
             "speedup": base / ms, "against": "our fp32 kernel"}
            for kernel in ("amx", "bf16") if cpu_prefill_attention.available(kernel)]


def fused_cases(repeats: int) -> list[dict]:
    rows = []
    hidden, inter, heads, d = 576, 1536, 12, 64  # q and k heads rotate together
    for m in (64, 4096):
        x, res, w = torch.randn(m, hidden), torch.randn(m, hidden), torch.randn(hidden)
        gate_up = torch.randn(m, 2 * inter)
        qk = torch.randn(m, heads * d + 3 * d)[:, : heads * d].view(m, heads, d)  # a view into the qkv rows
        cos, sin = torch.randn(m, 1, d // 2), torch.randn(m, 1, d // 2)
        for name, ref_fn, fn in [
            ("add + rms_norm", lambda: add_rms_norm_ref(x, res, w, 1e-5), lambda: fused.add_rms_norm(x, res, w, 1e-5)),
            ("silu_and_mul", lambda: silu_and_mul_ref(gate_up), lambda: fused.silu_and_mul(gate_up)),
            ("rope (q and k)", lambda: rope_ref(qk, cos, sin), lambda: fused.rope_(qk, cos, sin)),
        ]:
            ref, ours = median_ms(ref_fn, repeats), median_ms(fn, repeats)
            rows.append({"op": name, "case": f"{m} rows", "torch_ms": ref, "ours_ms": ours, "speedup": ref / ours})
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


def model_logits(rows: int = 64) -> torch.Tensor:
    """The default model's next-token logits at `rows` positions of a chat prompt and its continuation."""
    from runtime.build import make_runner
    from runtime.load import load_model
    from runtime.sequence import SeqChunk

    cfg, tensors, tok, _ = load_model(None)
    runner, _ = make_runner(cfg, tensors, 8 << 20, backend="torch")
    ids = tok.encode_chat([{"role": "user", "content": "Write a short story about a lighthouse keeper who finds "
                                                       "a message in a bottle."}])
    ids += tok.encode("Once upon a time, on a rocky island far from the coast, there lived an old keeper named "
                      "Tom. Every night he climbed the hundred stairs of the tower to light the lamp, and every "
                      "morning he walked along the shore to see what the sea had brought him.")
    assert len(ids) >= rows
    return runner.run([SeqChunk(ids, 0, list(range(8)), num_logits=rows)])


def hf_style_sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, then multinomial."""
    x = logits / temperature
    if top_k:
        x = x.masked_fill(x < torch.topk(x, top_k)[0][..., -1, None], float("-inf"))
    if top_p < 1.0:
        sorted_x, idx = torch.sort(x, descending=False)
        remove = sorted_x.softmax(-1).cumsum(-1) <= (1 - top_p)
        x = x.masked_fill(remove.scatter(1, idx, remove), float("-inf"))
    return torch.multinomial(x.softmax(-1), 1).squeeze(1)


def sampling_cases(repeats: int) -> list[dict]:
    from runtime.sampling.sampler import SamplingRow, sample
    from runtime.sampling_params import SamplingParams

    logits = model_logits()
    rows = []
    for t, k, p in [(1.0, 0, 1.0), (0.7, 0, 0.95), (1.0, 0, 0.9), (0.7, 50, 1.0)]:
        params = SamplingParams(temperature=t, top_k=k, top_p=p)
        srows = [SamplingRow(params, torch.Generator().manual_seed(i)) for i in range(len(logits))]
        ref = median_ms(lambda: hf_style_sample(logits, t, k, p), repeats)
        ours = median_ms(lambda: sample(logits, srows), repeats)
        name = f"T {t}" + (f", top_k {k}" if k else "") + (f", top_p {p}" if p < 1 else "")
        rows.append({"op": "sampling", "case": f"64 rows, {name}", "torch_ms": ref, "ours_ms": ours,
                     "speedup": ref / ours})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    for kernels in (cpu_decode_attention, cpu_prefill_attention, fused):
        if kernels.unavailable_reason() is not None:
            print(f"{kernels.__name__} is unavailable: {kernels.unavailable_reason()}", file=sys.stderr)
            return 1
    tune_host_allocator()  # as the engine does: large temporaries stay mapped between calls
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = (attention_cases(args.repeats) + prefill_cases(args.repeats) + fused_cases(args.repeats)
            + linear_cases(args.repeats) + sampling_cases(args.repeats))
    print(f"{'op':<20} {'case':<40} {'peer ms':>9} {'ours ms':>9} {'speed-up':>9}  peer")
    for r in rows:
        print(f"{r['op']:<20} {r['case']:<40} {r['torch_ms']:>9.3f} {r['ours_ms']:>9.3f} {r['speedup']:>8.2f}x"
              f"  {r.get('against', 'torch')}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
