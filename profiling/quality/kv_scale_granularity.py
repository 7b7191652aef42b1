"""Static per-(layer, KV head) scales against per-token dynamic ones (a scale per token x KV head, computed
when the token's K/V is written), for the int8 and e4m3 KV caches, on kv_cache_quality.py's four cases.

    python profiling/quality/kv_scale_granularity.py [--model PATH] [--json PATH] [--smoke]

A faithful simulation: the cache is float32, and every K/V row the engine writes is first rounded exactly as
the 8-bit cache would hold it (stored = round(x / scale) saturated, read back as stored * scale in fp32, the
C kernels' dequantization), the chunk's own new keys too, as the engine's quantized path does. Decode then
runs the per-layer path (the fused C decode step writes its K/V itself). Rows:

- "static (sim)": the engine's calibrated per-head scales through this simulation; it must reproduce
  kv_cache_quality.py's int8 / fp8_e4m3 rows (the check that the simulation is the cache);
- "per-token": scale = max |x| over the head's d values / 127 (int8) or / 448 (e4m3), per token and KV head,
  kept as fp32 beside the block (4 bytes per token x KV head, for K and for V);
- "per-token fp16": the same, the scale itself rounded to fp16 (2 bytes), the cheaper way to keep it.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from cute_kernels.kv_quant import QMAX, round_trip  # noqa: E402
from profiling.common.report_files import OUT  # noqa: E402
from profiling.quality import kv_cache_quality as kvq  # noqa: E402
from runtime.accel.kv_scales import TINY, KVScaleSource, calibrate, calibration_ids  # noqa: E402
from runtime.build import make_runner  # noqa: E402

DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
MODES = ("static (sim)", "per-token", "per-token fp16")


def per_token_round_trip(x: torch.Tensor, dtype: torch.dtype, scale_dtype: torch.dtype) -> torch.Tensor:
    """x [tokens, kv_heads, d] as an 8-bit cache with one scale per (token, KV head) holds it."""
    scale = (x.float().abs().amax(-1, keepdim=True) / QMAX[dtype]).clamp_min(TINY).to(scale_dtype).float()
    lo, hi = -QMAX[dtype] - (1 if dtype == torch.int8 else 0), QMAX[dtype]
    q = (x.float() / scale).clamp(lo, hi)
    q = q.round() if dtype == torch.int8 else q.to(dtype).float()
    return (q * scale).to(x.dtype)


def simulated_runner(cfg, tensors: dict, dtype: torch.dtype, mode: str, tokens: int, calibration: list[int]):
    """A float32-cache runner whose every K/V write (and the chunk's own new K/V) is rounded as mode's cache."""
    blocks = kvq.math.ceil(tokens / kvq.BLOCK) + 1
    budget = blocks * kvq.BLOCK * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    runner, _ = make_runner(cfg, dict(tensors), budget, kvq.BLOCK, kv_dtype=torch.float32,
                            kv_scale_source=KVScaleSource(calibration))
    model = runner.model
    model.decode_step = None
    static = calibrate(model, calibration, dtype, torch.device("cpu")) if mode == "static (sim)" else None
    for i, layer in enumerate(model.layers):
        layer.kv_scales = static[i] if static is not None else None
    backend = model.backend
    inner = backend.attention

    def attention(q, k, v, k_cache, v_cache, batch, scale, kv_scales=None):
        if kv_scales is not None:
            k, v = round_trip(k, dtype, kv_scales.k), round_trip(v, dtype, kv_scales.v)
        else:
            scale_dtype = torch.float16 if mode.endswith("fp16") else torch.float32
            k, v = per_token_round_trip(k, dtype, scale_dtype), per_token_round_trip(v, dtype, scale_dtype)
        return inner(q, k, v, k_cache, v_cache, batch, scale, None)

    backend.attention = attention
    return runner, list(range(blocks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--json", default=os.path.join(OUT, "kv_scale_granularity.json"))
    ap.add_argument("--smoke", action="store_true", help="seconds: a tiny random model")
    args = ap.parse_args()
    cfg, tensors, tok, path, text = kvq.load(args)
    ids = tok.encode(text)
    long_ids = (ids * kvq.LONG_COPIES)[:cfg.max_position_embeddings]
    long_from = kvq.LONG_FROM if len(long_ids) > kvq.LONG_FROM + kvq.CHUNK else len(long_ids) // 2
    calibration = calibration_ids(tok.encode)
    reply_tokens = 8 if args.smoke else kvq.REPLY_TOKENS
    tokens = len(long_ids) + 2 * kvq.CHUNK
    print(f"{os.path.basename(path)}; torch threads {torch.get_num_threads()}")

    def scores(runner, table, replies):
        chat, got = kvq.conversation(runner, table, tok, text[:1200], replies, reply_tokens)
        long = kvq.teacher_forced(runner, table, long_ids)
        return {"text": kvq.teacher_forced(runner, table, ids), "long": long,
                f"long past {long_from}": long.since(long_from - 1), "multi-turn": chat}, got

    runner, table = kvq.runner_for(cfg, tensors, kvq.REFERENCE, tokens, calibration)
    ref, replies = scores(runner, table, None)
    rows = {}
    for name, dtype in DTYPES.items():
        runner, table = kvq.runner_for(cfg, tensors, name, tokens, calibration)
        rows[f"{name} static (engine)"] = scores(runner, table, replies)[0]
        for mode in MODES:
            runner, table = simulated_runner(cfg, tensors, dtype, mode, tokens, calibration)
            rows[f"{name} {mode}"] = scores(runner, table, replies)[0]
    report = {"model": path, "reference": kvq.REFERENCE, "cases": {}}
    print(f"{'case':<16}{'KV cache':<26}{'perplexity':>11}{'vs bf16':>9}{'top-1 = bf16':>14}{'(clear)':>9}")
    for case, ref_scores in ref.items():
        base = kvq.compare(ref_scores, ref_scores)["perplexity"]
        report["cases"][case] = {}
        for label, got in rows.items():
            row = report["cases"][case][label] = kvq.scored_row(got[case], ref_scores, base)
            kvq.print_row(case, label, row, 26)
    kvq.write_report(args.json, report)

if __name__ == "__main__":
    main()
